"""NVSwitch systems (issue 15): NVIDIA's fabric manager on a fresh sandbox host whose PCI bus is a
substituted sysfs tree (stack_sysfs_root) of an HGX board, with Ubuntu focal's real packages.

The container has no GPU (stack_no_gpu: true): that skips the GPU checks, not the NVSwitch one.

- branch 535, distro: focal's nvidia-fabricmanager-535 is 535.247.01 while its driver is 535.230.02, and
  the fabric manager refuses to run at another version than the driver's: the preflight refuses, naming
  both versions and what works, and the host is unchanged (apt's package lists aside: the preflight
  refreshes them on NVSwitch hosts to read the versions, as --check does);
- branch 470, distro: `site.yml --tags preflight,nvidia_driver` installs nvidia-fabricmanager-470 at
  exactly the driver's version (a real DKMS build of the 470 module, 2-3 minutes), holds it with the
  driver packages and enables its unit (the symlink: systemd is not PID 1 in the container, and without a
  GPU the unit is not started); a re-run changes nothing; the driver's uninstall removes it too.

The A100 board's tree also has Secure Boot on (its EFI variable, as test_secure_boot.py substitutes it) and
the 470 converge asks for DKMS (nvidia_driver_module: dkms): the same converge is the DKMS signing path's,
so that real module build (the longest step) runs once for both. Ubuntu's shim-signed, sbsigntool and mokutil,
the key made by update-secureboot-policy, the module signed by Ubuntu's DKMS (kmodsign), the signer read back
with modinfo; a container has no EFI variables, so mokutil cannot queue the enrolment here: the run says so
and names the command (on a real host it queues it with a one-time password; untested here).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from testbed import fingerprint, sandbox
from tests.conftest import unpinned_files

from .conftest import Host, pci_tree_script, run_playbook

# (device, class) of each PCI function of the boards, as sysfs writes them.
HGX_H100 = [("0x2330", "0x030200")] * 8 + [("0x22a3", "0x068000")] * 4  # 8x H100 SXM5, 4 NVSwitches (gen 3)
HGX_A100 = [("0x20b0", "0x030200")] * 8 + [("0x1af1", "0x068000")] * 6  # 8x A100 SXM4, 6 NVSwitches (gen 2)
TREES = {"h100": HGX_H100, "a100": HGX_A100}
SYSFS = "/tmp/msgpu-sysfs-{}"
SECURE_BOOT_VAR = "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

RECAP = re.compile(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# As test_preflight.py's check-mode test: apt's package lists and caches are metadata, not state.
APT_METADATA = ("/var/lib/apt/lists", "/var/cache/apt", "/var/log/apt", "/root/.ansible_async")
UNCHANGED = fingerprint.script(marker="/msgpu-marker", prune=(*fingerprint.PRUNE, *APT_METADATA))
FM_UNIT = "nvidia-fabricmanager.service"


@pytest.fixture(scope="module")
def host() -> Host:
    """A fresh focal host with both boards' trees (written before the fingerprints are taken)."""
    name = "msgpu-it-fabricmanager"
    sandbox.start_host(name, compiler_cache=True)
    try:
        host = Host(name)
        assert host.sh("touch /msgpu-marker").returncode == 0
        for board, functions in TREES.items():
            made = host.sh(pci_tree_script(SYSFS.format(board), functions))
            assert made.returncode == 0, made.stderr
        secure_boot = f"{SYSFS.format('a100')}/{SECURE_BOOT_VAR}"
        made = host.sh(f"mkdir -p $(dirname {secure_boot}) && printf '\\006\\000\\000\\000\\001' > {secure_boot}")
        assert made.returncode == 0, made.stderr
        yield host
    finally:
        sandbox.stop_host(name)


@pytest.fixture(scope="module")
def board_inventory(tmp_path_factory, catalog):
    """As the integration conftest's (stand-in checksums for NVIDIA's unpinned files, no controller
    cache), for this module's fixtures."""

    def make(host: Host, group_vars: dict) -> Path:
        settings = {
            "stack_artifact_checksums": {name: "ab" * 32 for name in unpinned_files(catalog)},
            "stack_artifact_cache_dir": "",
            **group_vars,
        }
        return sandbox.write_inventory(
            tmp_path_factory.mktemp("fabricmanager") / "inventory.yml", [host.name], settings
        )

    return make


def _changed(result, host: Host) -> int:
    rows = {h: (int(c), int(u), int(f)) for h, c, u, f in RECAP.findall(result.output)}
    assert result.rc == 0 and host.name in rows, result.output[-6000:]
    count, unreachable, failed = rows[host.name]
    assert (unreachable, failed) == (0, 0), result.output[-6000:]
    return count


def _unchanged(host: Host) -> str:
    result = host.sh(UNCHANGED)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def refused_535(host: Host, board_inventory) -> dict:
    before = _unchanged(host)
    started = time.monotonic()
    result = run_playbook(
        "site.yml",
        board_inventory(host, group_vars={"stack_sysfs_root": SYSFS.format("h100"), "stack_driver_branch": "535"}),
    )
    print(f"site.yml, branch 535 on an HGX H100 tree: {time.monotonic() - started:.1f} s")
    print(" ".join(result.output[result.output.find("fatal: ") :].split("\n\n")[0].split()))
    return {"result": result, "before": before, "after": _unchanged(host)}


SETTINGS_470 = {
    "stack_sysfs_root": SYSFS.format("a100"),
    "stack_driver_branch": "470",
    "nvidia_driver_module": "dkms",  # under Secure Boot: DKMS with module signing (auto would take Canonical's)
    "nvidia_driver_poll_seconds": 5,
}


@pytest.fixture(scope="module")
def checked_470(host: Host, board_inventory, refused_535: dict) -> dict:
    """--check of the 470 install on the host as it still is: the fabric manager's tasks in check mode."""
    before = _unchanged(host)
    started = time.monotonic()
    result = run_playbook(
        "site.yml",
        board_inventory(host, group_vars=SETTINGS_470),
        args=["--tags", "preflight,nvidia_driver", "--check"],
    )
    print(f"site.yml --tags preflight,nvidia_driver --check, branch 470: {time.monotonic() - started:.1f} s")
    return {"result": result, "before": before, "after": _unchanged(host)}


@pytest.fixture(scope="module")
def converged_470(host: Host, board_inventory, checked_470: dict) -> dict:
    """After the refusal and the check (on the host as it was): the 470 driver with its fabric manager, then
    a re-run."""
    inventory = board_inventory(host, group_vars=SETTINGS_470)
    runs = {}
    for label in ("first", "again"):
        started = time.monotonic()
        # The first run builds the 470 module and installs the signing tools and the fabric manager: over
        # 10 minutes on two busy cores.
        runs[label] = run_playbook("site.yml", inventory, args=["--tags", "preflight,nvidia_driver"], timeout=1800)
        print(f"site.yml --tags preflight,nvidia_driver, branch 470 ({label}): {time.monotonic() - started:.1f} s")
    return {**runs, "inventory": inventory}


def test_focal_535_is_refused_naming_both_versions_and_what_works(refused_535: dict) -> None:
    result = refused_535["result"]
    assert result.rc != 0, result.output[-3000:]
    flat = " ".join(result.output.split())
    for text in (
        "4 NVSwitch(es) on the PCI bus (10de:22a3 at 0000:18:00.0, 0000:19:00.0, 0000:1a:00.0, 0000:1b:00.0)",
        "need NVIDIA's fabric manager at exactly the driver's version",
        'stack_driver_branch "535" with stack_driver_method distro has none',
        "apt here has nvidia-fabricmanager-535 535.247.01 (535.247.01-",
        "the driver's libnvidia-compute-535 535.230.02 (535.230.02-",
        'Allowed: stack_driver_branch "470" (nvidia-fabricmanager-470 and libnvidia-compute-470 are both 470.256.02',
        "or stack_driver_method: cuda_repo",
    ):
        assert text in flat, f"{text!r} not in:\n{result.output[-3000:]}"
    assert "TASK [nvidia_driver" not in result.output


def test_the_refused_host_is_unchanged(refused_535: dict) -> None:
    assert refused_535["after"] == refused_535["before"]


def test_check_mode_says_what_it_would_install_and_changes_nothing(checked_470: dict, host: Host) -> None:
    result = checked_470["result"]
    assert _changed(result, host) > 0
    flat = " ".join(result.output.split())
    assert "nvidia-fabricmanager-470 would be installed at exactly the version of libnvidia-compute-470" in flat
    assert checked_470["after"] == checked_470["before"]


def test_470_converges_with_its_fabric_manager(converged_470: dict, host: Host) -> None:
    first = converged_470["first"]
    assert _changed(first, host) > 0
    flat = " ".join(first.output.split())
    assert "6 NVSwitch(es): nvidia-fabricmanager-470 470.256.02" in flat, first.output[-3000:]


def test_the_fabric_manager_is_at_exactly_the_drivers_version_and_held(converged_470: dict, host: Host) -> None:
    shown = host.sh(
        "dpkg-query -W -f='${Package} ${db:Status-Status} ${Version}\\n' "
        "nvidia-fabricmanager-470 libnvidia-compute-470 nvidia-dkms-470"
    ).stdout.split("\n")
    versions = {line.split()[0]: line.split()[1:] for line in shown if line}
    assert versions["nvidia-fabricmanager-470"][0] == "installed", versions
    assert versions["nvidia-fabricmanager-470"][1] == versions["libnvidia-compute-470"][1], versions
    assert versions["nvidia-fabricmanager-470"][1] == versions["nvidia-dkms-470"][1], versions
    assert versions["nvidia-fabricmanager-470"][1].startswith("470.256.02-"), versions
    held = host.sh("apt-mark showhold").stdout.split()
    assert {"nvidia-fabricmanager-470", "nvidia-dkms-470", "libnvidia-compute-470"} <= set(held), held


def test_the_fabric_manager_is_enabled_not_started(converged_470: dict, host: Host) -> None:
    """systemd is not PID 1 in the container: `systemctl enable` leaves the [Install] symlink; no GPU, so
    the role does not start it (and nothing else did: policy-rc.d keeps package scripts from it)."""
    links = host.sh(f"ls -l /etc/systemd/system/*.wants/{FM_UNIT}").stdout
    assert f"/lib/systemd/system/{FM_UNIT}" in links, links
    assert "nv-fabricmanager" not in host.sh("cat /proc/[0-9]*/comm 2>/dev/null").stdout.split()


def test_a_rerun_changes_nothing(converged_470: dict, host: Host) -> None:
    assert _changed(converged_470["again"], host) == 0, converged_470["again"].output[-6000:]


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_dkms_module_is_signed_with_the_hosts_generated_key(converged_470: dict, host: Host) -> None:
    first = converged_470["first"]
    assert first.rc == 0, first.output[-5000:]
    key = host.sh(
        "openssl x509 -inform DER -in /var/lib/shim-signed/mok/MOK.der -noout -subject -nameopt multiline"
        " | sed -n 's/^ *commonName *= *//p'"
    ).stdout.strip()
    assert key == f"{host.name} Secure Boot Module Signature key", key
    assert host.sh("stat -c %a /var/lib/shim-signed/mok/MOK.priv").stdout.strip() == "600"
    modules = host.sh("ls /lib/modules/*/updates/dkms/nvidia*.ko").stdout.split()
    assert any(m.endswith("/nvidia.ko") for m in modules), modules
    for module in modules:
        signer = host.sh(f"modinfo -F signer {module}").stdout.strip()
        assert signer == key, (module, signer)
    assert f'signed by "{key}"' in flat(first.output)


def test_the_run_says_the_enrolment_could_not_be_queued_in_a_container(converged_470: dict) -> None:
    output = flat(converged_470["first"].output)
    assert "the firmware could not be asked (EFI variables are not supported on this system" in output, output[-3000:]
    assert "sudo mokutil --import /var/lib/shim-signed/mok/MOK.der" in output


def test_the_driver_uninstall_removes_the_fabric_manager(converged_470: dict, host: Host) -> None:
    started = time.monotonic()
    result = run_playbook(
        "site.yml", converged_470["inventory"], {"nvidia_driver_state": "absent"}, ["--tags", "preflight,nvidia_driver"]
    )
    print(f"site.yml --tags preflight,nvidia_driver, state absent: {time.monotonic() - started:.1f} s")
    assert _changed(result, host) > 0
    left = host.sh("dpkg-query -W -f='${Package} ${db:Status-Status}\\n' 'nvidia-*' 'libnvidia-*' 2>/dev/null").stdout
    assert [line for line in left.splitlines() if line.endswith(" installed")] == [], left
    assert host.sh(f"ls /etc/systemd/system/*.wants/{FM_UNIT}").returncode != 0
    assert "nvidia-fabricmanager-470" not in host.sh("apt-mark showhold").stdout
