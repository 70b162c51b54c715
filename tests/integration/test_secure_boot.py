"""Secure Boot, on real focal containers whose PCI bus and EFI variables are substituted (stack_sysfs_root: an
RTX 3090 and SecureBoot-... = 1), so the decisions a GPU host with Secure Boot meets run here:
`nvidia_driver_module: auto` chooses Canonical's signed precompiled modules (asked of the real apt archive:
linux-modules-nvidia-470-*); DKMS (asked for, or the runfile method) is accepted and signed with the host's
machine owner key; precompiled where it cannot be is refused before any change, saying what works.

The DKMS signing path runs for real on test_fabricmanager.py's host (its A100 board's tree has Secure Boot
on: one real DKMS build of the 470 module for both), the module's signer read back with modinfo there.
The precompiled install itself runs in tests/system/test_driver_upgrade.py (signer checked with modinfo).
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import run_playbook

SYSFS = "/tmp/msgpu-sysfs"
SECURE_BOOT_VAR = "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
GPU = "bus/pci/devices/0000:01:00.0"


@pytest.fixture
def secure_boot_host(focal_host):
    """The session's focal host with a substituted /sys: one RTX 3090 (10de:2204), Secure Boot on."""
    script = (
        f"mkdir -p {SYSFS}/{GPU} {SYSFS}/$(dirname {SECURE_BOOT_VAR}) && "
        f"echo 0x10de > {SYSFS}/{GPU}/vendor && echo 0x2204 > {SYSFS}/{GPU}/device && "
        f"echo 0x030000 > {SYSFS}/{GPU}/class && printf '\\006\\000\\000\\000\\001' > {SYSFS}/{SECURE_BOOT_VAR}"
    )
    assert focal_host.sh(script).returncode == 0
    yield focal_host
    focal_host.sh(f"rm -rf {SYSFS}")


def settings(**extra) -> dict:
    return {"stack_no_gpu": False, "stack_sysfs_root": SYSFS, **extra}


def flat(text: str) -> str:
    return " ".join(text.split())


def test_auto_picks_canonicals_signed_modules_under_secure_boot(secure_boot_host, inventory_for):
    result = run_playbook("site.yml", inventory_for(secure_boot_host), settings(), ["--tags", "preflight"])
    output = flat(result.output)
    assert result.rc == 0, result.output[-4000:]
    assert "SecureBoot enabled" in output
    assert (
        "NVIDIA kernel module from Canonical's signed precompiled modules (linux-modules-nvidia-470-generic" in output
    )
    assert "(nvidia_driver_module auto; SecureBoot enabled)" in output


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"nvidia_driver_module": "dkms"}, id="dkms"),
        pytest.param({"stack_driver_method": "runfile"}, id="runfile"),
    ],
)
def test_dkms_under_secure_boot_is_accepted_and_will_be_signed(secure_boot_host, inventory_for, extra):
    before = secure_boot_host.fingerprint()
    result = run_playbook("site.yml", inventory_for(secure_boot_host), settings(**extra), ["--tags", "preflight"])
    output = flat(result.output)
    assert result.rc == 0, result.output[-4000:]
    assert "NVIDIA kernel module from DKMS, signed with this host's machine owner key" in output, output[-3000:]
    assert secure_boot_host.fingerprint() == before


def test_precompiled_with_the_runfile_is_refused_before_any_change(secure_boot_host, inventory_for):
    before = secure_boot_host.fingerprint()
    extra = {"stack_driver_method": "runfile", "nvidia_driver_module": "precompiled"}
    result = run_playbook("site.yml", inventory_for(secure_boot_host), settings(**extra))
    output = flat(result.output)
    assert result.rc != 0, result.output[-3000:]
    for text in ["nvidia_driver_module: precompiled needs Canonical's signed modules", "distro method only"]:
        assert text in output, (text, result.output[-4000:])
    assert "Allowed:" in output
    assert secure_boot_host.fingerprint() == before
