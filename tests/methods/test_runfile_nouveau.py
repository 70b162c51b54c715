"""The runfile method on a GPU host where nouveau is loaded (runfile scenario only; before the uninstall test):
NVIDIA's installer test-loads the module it built, which fails while nouveau holds the GPU, so the role
refuses to run it unless it may reboot the host first. The GPU and nouveau are substituted (an RTX 3090 on a
substituted PCI bus, nouveau in a substituted /proc/modules: stack_sysfs_root, stack_procfs_root); the
install the role would redo is real (the scenario's runfile install, its marker made stale).
"""

from __future__ import annotations

from pathlib import Path

from tests.system.conftest import on_host, playbook

TREE = "/tmp/msgpu-nouveau"
MARKER = "/var/lib/msgpu/nvidia-driver-runfile.sha256"


def test_the_runfile_is_refused_while_nouveau_is_loaded(scenario: str, inventory: Path, host: str) -> None:
    # ./toolkit test runs this module on the runfile scenario's host only (testbed/scenarios.py).
    assert scenario == "runfile", f"the runfile method's check, run on the {scenario} host"
    pci = f"{TREE}/sys/bus/pci/devices/0000:01:00.0"
    made = on_host(
        host,
        f"set -e; mkdir -p {pci} {TREE}/proc; echo 0x10de > {pci}/vendor; echo 0x2204 > {pci}/device; "
        f"echo 0x030000 > {pci}/class; echo 'nouveau 2297856 0 - Live 0x0000000000000000' > {TREE}/proc/modules",
    )
    assert made.returncode == 0, made.stderr
    # The role's marker (roles/nvidia_driver/vars/main.yml) names another runfile: it would install again.
    original = on_host(host, f"cat {MARKER}").stdout.strip()
    assert len(original) == 64, f"the runfile install's marker {MARKER}: {original!r}"
    assert on_host(host, f"echo stale > {MARKER}").returncode == 0
    try:
        settings = {
            "stack_no_gpu": False,
            "stack_sysfs_root": f"{TREE}/sys",
            "stack_procfs_root": f"{TREE}/proc",
            "nvidia_driver_reboot": False,
        }
        proc, wall = playbook(inventory, settings, "preflight,nvidia_driver")
        print(f"runfile with nouveau loaded: {wall:.1f} s")
        flat = " ".join(proc.stdout.split())
        assert proc.returncode != 0, proc.stdout[-3000:]
        assert "nouveau is loaded, and NVIDIA's runfile installer fails while it is." in flat, proc.stdout[-3000:]
        assert "nvidia_driver_reboot is false (or nvidia_driver_blacklist_nouveau is false)" in flat
        # Refused before the installer: the marker is as the test left it, the installed driver still there.
        assert on_host(host, f"cat {MARKER}").stdout.strip() == "stale"
        assert on_host(host, "test -x /usr/bin/nvidia-uninstall").returncode == 0
    finally:
        on_host(host, f"rm -rf {TREE}; echo {original} > {MARKER}")
