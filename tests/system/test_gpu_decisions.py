"""The nvidia_driver role's decisions for hosts with a GPU, which every other test skips (stack_no_gpu), run on
the provisioned host (molecule default's) with the GPU substituted where the decision only reads state: a
sysfs tree with an RTX 3090 on the PCI bus and the loaded module's version (stack_sysfs_root), a procfs tree
with the loaded modules (stack_procfs_root). The installed module is the real one (DKMS's build for the
host's kernels).

- the loaded module older than the installed one: a reboot is needed; with nvidia_driver_reboot: false the
  run says so and why, and does not reboot;
- nouveau loaded and no NVIDIA module: both reasons named;
- the loaded module is the installed one: no reboot, and a re-run changes nothing.

What a container cannot do is not run: the reboot itself (nvidia_driver_reboot: true), starting
nvidia-persistenced (no systemd as PID 1; nvidia_driver_persistence_mode is off in these runs, its drop-in is
tested in the molecule scenarios), loading a module. The last run restores the provisioned settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.conftest import changed, on_host, playbook

TREE = "/tmp/msgpu-gpu"
RTX_3090 = ("0000:01:00.0", "0x10de", "0x2204", "0x030000")
SETTINGS = {
    "stack_no_gpu": False,
    "stack_sysfs_root": f"{TREE}/sys",
    "stack_procfs_root": f"{TREE}/proc",
    "nvidia_driver_reboot": False,
    "nvidia_driver_persistence_mode": False,
}
NOT_ALLOWED = "nvidia_driver_reboot is false, so reboot it yourself."


def flat(text: str) -> str:
    return " ".join(text.split())


def substitute(host: str, loaded: str, nouveau: bool) -> None:
    """The trees: the GPU on the PCI bus, the loaded NVIDIA module's version ("": none loaded), nouveau."""
    slot, vendor, device, klass = RTX_3090
    pci = f"{TREE}/sys/bus/pci/devices/{slot}"
    script = [
        f"set -e; rm -rf {TREE}; mkdir -p {pci} {TREE}/proc",
        f"echo {vendor} > {pci}/vendor; echo {device} > {pci}/device; echo {klass} > {pci}/class",
        f"echo 'snd_hda_intel 53248 0 - Live 0x0000000000000000' > {TREE}/proc/modules",
    ]
    if loaded:
        script.append(f"mkdir -p {TREE}/sys/module/nvidia && echo {loaded} > {TREE}/sys/module/nvidia/version")
    if nouveau:
        script.append(f"echo 'nouveau 2297856 0 - Live 0x0000000000000000' >> {TREE}/proc/modules")
    made = on_host(host, "\n".join(script))
    assert made.returncode == 0, made.stderr


@pytest.fixture(scope="module")
def installed(host: str) -> str:
    """The installed module's version, as the role finds it (the newest kernel with one: the container runs
    the machine's kernel, which has none)."""
    newest_first = "for k in $(ls -1 /lib/modules | sort -rV); do modinfo -k $k -F version nvidia && break; done"
    found = on_host(host, newest_first)
    version = found.stdout.strip()
    assert version.count(".") == 2, found.stdout + found.stderr
    return version


@pytest.fixture(scope="module")
def restore(inventory: Path, host: str):
    yield
    on_host(host, f"rm -rf {TREE}")
    proc, wall = playbook(inventory, {}, "preflight,nvidia_driver")
    print(f"restored the provisioned settings: {wall:.1f} s")
    assert changed(proc, host) > 0  # the persistence drop-in is back


def test_an_older_loaded_module_needs_a_reboot_that_is_reported(inventory, host, installed, restore):
    substitute(host, loaded="470.86", nouveau=False)
    proc, wall = playbook(inventory, SETTINGS, "preflight,nvidia_driver")
    print(f"GPU host, older module loaded: {wall:.1f} s")
    changed(proc, host)
    out = flat(proc.stdout)
    assert "1 GPU(s)" in out and "10de:2204" in out, proc.stdout[-3000:]
    reason = f"the loaded NVIDIA module is 470.86, the installed one {installed}"
    assert f"needs a reboot to use the driver ({reason}); {NOT_ALLOWED}" in out, proc.stdout[-3000:]
    assert "TASK [nvidia_driver : Reboot to load the driver]" in proc.stdout
    assert "Rebooting to load the NVIDIA driver" not in out


def test_nouveau_loaded_and_no_nvidia_module_are_both_named(inventory, host, installed, restore):
    substitute(host, loaded="", nouveau=True)
    proc, wall = playbook(inventory, SETTINGS, "preflight,nvidia_driver")
    print(f"GPU host, nouveau loaded: {wall:.1f} s")
    changed(proc, host)
    reasons = "nouveau is loaded; the NVIDIA module is not loaded"
    assert f"needs a reboot to use the driver ({reasons}); {NOT_ALLOWED}" in flat(proc.stdout), proc.stdout[-3000:]


def test_the_installed_module_loaded_needs_no_reboot_and_a_rerun_changes_nothing(inventory, host, installed, restore):
    substitute(host, loaded=installed, nouveau=False)
    for label in ("first", "again"):
        proc, wall = playbook(inventory, SETTINGS, "preflight,nvidia_driver")
        print(f"GPU host, the installed module loaded ({label}): {wall:.1f} s")
        count = changed(proc, host)
        assert "needs a reboot" not in flat(proc.stdout), proc.stdout[-3000:]
    assert count == 0, proc.stdout[-3000:]
