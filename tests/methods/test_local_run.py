"""A one-box lab: the run's target is the machine Ansible runs on (the same machine id as the controller; or
connection local). The driver needs a reboot to load (a GPU on a substituted PCI bus, no NVIDIA module loaded),
and the run must not reboot the machine it runs on: it says so in the preflight, leaves the reboot to the admin
and ends with "reboot this machine, then run the same command again", a distinct outcome and not a failed host.
On the runfile scenario's converged host (its real driver install), before the uninstall test.
"""

from __future__ import annotations

from pathlib import Path

from tests.system.conftest import on_host, playbook

TREE = "/tmp/msgpu-local-run"


def test_the_machine_ansible_runs_on_is_never_rebooted(scenario: str, inventory: Path, host: str) -> None:
    assert scenario == "runfile", f"the local-run check, run on the {scenario} host"
    controller_id = Path("/etc/machine-id").read_text().strip()
    assert len(controller_id) == 32, "the controller has no systemd machine id to compare"
    pci = f"{TREE}/sys/bus/pci/devices/0000:01:00.0"
    saved = on_host(host, "cat /etc/machine-id 2>/dev/null || echo NONE").stdout.strip()
    made = on_host(
        host,
        f"set -e; mkdir -p {pci} {TREE}/proc; echo 0x10de > {pci}/vendor; echo 0x2204 > {pci}/device; "
        f"echo 0x030000 > {pci}/class; : > {TREE}/proc/modules; echo {controller_id} > /etc/machine-id",
    )
    assert made.returncode == 0, made.stderr
    try:
        settings = {
            "stack_no_gpu": False,
            "stack_sysfs_root": f"{TREE}/sys",
            "stack_procfs_root": f"{TREE}/proc",
            # The reboot is allowed (the default): only the machine being the controller holds it back.
            "nvidia_driver_reboot": True,
            "nvidia_driver_persistence_mode": False,
        }
        proc, wall = playbook(inventory, settings, "preflight,nvidia_driver")
        print(f"local run, driver needing a reboot: {wall:.1f} s")
        flat = " ".join(proc.stdout.replace("''", "'").split())
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert (
            f"{host} is the machine Ansible runs on (the same machine id as the controller): the run never reboots it"
        ) in flat
        assert "Rebooting to load the NVIDIA driver" not in flat
        assert (
            f"{host} is the machine Ansible runs on and needs a reboot to use the driver (the NVIDIA module is not "
            "loaded): reboot this machine, then run the same command again"
        ) in flat
        assert "Reboot pending (not a failure): " in flat and "Every host finished." in flat
    finally:
        restore = "rm -f /etc/machine-id" if saved == "NONE" else f"echo {saved} > /etc/machine-id"
        on_host(host, f"rm -rf {TREE}; {restore}")
