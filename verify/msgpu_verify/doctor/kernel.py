"""Rules on the kernel's side of the driver: nouveau (loaded, blacklisted), the DKMS module of every kernel
with headers, and Secure Boot against an unsigned module."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .core import Finding, Host, read_bytes, read_text

SECURE_BOOT_VAR = "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


MODULE_SIGNATURE_MAGIC = b"~Module signature appended~\n"


# Where DKMS, the runfile and distribution kernels put the NVIDIA module below /lib/modules/<kernel>.
MODULE_SUBDIRS = ("updates/dkms", "updates", "extra", "kernel/drivers/video", "kernel/drivers/char/drm", "misc")


def loaded_modules(host: Host) -> Optional[Dict[str, str]]:
    text = read_text(host.proc / "modules")
    if text is None:
        return None
    return {line.split()[0]: line for line in text.splitlines() if line.strip()}


def running_kernel(host: Host) -> str:
    if host.kernel:
        return host.kernel
    text = read_text(host.proc / "sys/kernel/osrelease")
    return text.strip() if text else os.uname().release


def rule_nouveau(host: Host) -> List[Finding]:
    findings: List[Finding] = []
    modules = loaded_modules(host)
    if modules is None:
        findings.append(
            Finding(
                "kernel-modules-unreadable",
                "info",
                "The loaded kernel modules cannot be read",
                [f"{host.proc / 'modules'} is missing (a container or a restricted /proc)"],
                "Run the doctor on the host itself (not in a container) to check nouveau and the NVIDIA module.",
            )
        )
    elif "nouveau" in modules:
        findings.append(
            Finding(
                "nouveau-loaded",
                "error",
                "nouveau, the open-source driver, holds the GPUs, so the NVIDIA driver cannot load",
                [f"{host.proc / 'modules'}: {modules['nouveau'].strip()}"],
                "Blacklist nouveau (nvidia_driver_blacklist_nouveau: true, then `./toolkit provision`, which writes "
                "/etc/modprobe.d/blacklist-nouveau.conf), then `sudo update-initramfs -u` and reboot.",
            )
        )
    blacklisted = []
    for folder in ("/etc/modprobe.d", "/lib/modprobe.d", "/usr/lib/modprobe.d"):
        for conf in sorted(host.path(folder).glob("*.conf")):
            if re.search(r"^\s*blacklist\s+nouveau\s*$", read_text(conf) or "", re.MULTILINE):
                blacklisted.append(host.shown(conf))
    if not blacklisted:
        findings.append(
            Finding(
                "nouveau-not-blacklisted",
                "warning",
                "nouveau is not blacklisted: after the next reboot it may claim the GPUs before the NVIDIA driver",
                ["no `blacklist nouveau` line in /etc/modprobe.d/*.conf, /lib/modprobe.d/*.conf"],
                "Set nvidia_driver_blacklist_nouveau: true (the default) and run `./toolkit provision`; it writes "
                "/etc/modprobe.d/blacklist-nouveau.conf and updates the initramfs.",
            )
        )
    return findings


def _module_files(host: Host, kernel: str, module: str) -> List[Path]:
    base = host.path(f"/lib/modules/{kernel}")
    files: List[Path] = []
    for sub in MODULE_SUBDIRS:
        files.extend(sorted((base / sub).glob(f"{module}.ko*")))
    # Canonical's signed precompiled modules (linux-modules-nvidia-<branch>-<kernel>).
    files.extend(sorted(base.glob(f"kernel/nvidia-[0-9]*/{module}.ko*")))
    return files


def rule_dkms(host: Host) -> List[Finding]:
    module = str((host.expect.get("driver") or {}).get("dkms_module") or "nvidia")
    findings: List[Finding] = []
    modules_root = host.path("/lib/modules")
    kernels = sorted(p.name for p in modules_root.iterdir() if p.is_dir()) if modules_root.is_dir() else []
    dkms_built = sorted(glob.glob(str(host.path(f"/var/lib/dkms/{module}/*/*/*/module/{module}.ko*"))))
    registered = sorted(p.name for p in host.path(f"/var/lib/dkms/{module}").glob("*") if re.match(r"\d", p.name))
    missing = []
    for kernel in kernels:
        has_headers = (modules_root / kernel / "build" / "Makefile").exists()
        if has_headers and not _module_files(host, kernel, module):
            built = [b for b in dkms_built if f"/{kernel}/" in b]
            missing.append((kernel, built))
    for kernel, built in missing:
        state = (
            f"DKMS built it ({host.shown(Path(built[0]))}) but it is not installed"
            if built
            else f"DKMS has not built it (registered: {', '.join(registered) or 'no version of ' + module})"
        )
        findings.append(
            Finding(
                "dkms-module-missing",
                "error",
                f"Kernel {kernel} has headers but no {module} module: booting it leaves the GPUs without a driver",
                [
                    f"{host.shown(modules_root / kernel / 'build/Makefile')} exists",
                    f"no {module}.ko in {host.shown(modules_root / kernel)}/{{{','.join(MODULE_SUBDIRS)}}}",
                    state,
                ],
                f"Build it: `sudo dkms autoinstall -k {kernel}` (or `./toolkit provision`, whose nvidia_driver role "
                f"builds the module for every kernel with headers). If the build fails, read "
                f"/var/lib/dkms/{module}/*/build/make.log: a kernel newer than the driver branch supports needs a "
                "newer "
                "stack_driver_branch.",
            )
        )
    running = running_kernel(host)
    if running in kernels:
        if not _module_files(host, running, module) and running not in [k for k, _ in missing]:
            findings.append(
                Finding(
                    "driver-module-missing-running-kernel",
                    "error",
                    f"The running kernel {running} has no {module} module",
                    [f"no {module}.ko in {host.shown(modules_root / running)} and no headers to build one"],
                    f"Install the headers and build it: `sudo apt-get install linux-headers-{running}` then "
                    f"`sudo dkms autoinstall -k {running}` (or `./toolkit provision`).",
                )
            )
    elif kernels or registered:
        findings.append(
            Finding(
                "running-kernel-not-installed",
                "info",
                f"The running kernel {running} has no /lib/modules folder here (a container shares its host's kernel)",
                [f"{host.shown(modules_root)} holds: {', '.join(kernels) or 'nothing'}"],
                "Nothing to do in a container; on a real host, reboot into an installed kernel.",
            )
        )
    return findings


def _secure_boot(host: Host) -> Tuple[Optional[bool], str]:
    path = host.sys / SECURE_BOOT_VAR
    data = read_bytes(path)
    if data is None or len(data) < 5:
        return None, str(path)
    return data[4] == 1, str(path)


def module_signed(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(-len(MODULE_SIGNATURE_MAGIC), os.SEEK_END)
            return handle.read() == MODULE_SIGNATURE_MAGIC
    except OSError:
        return False


def rule_secure_boot(host: Host) -> List[Finding]:
    enabled, where = _secure_boot(host)
    if enabled is None:
        return [
            Finding(
                "secure-boot-unknown",
                "info",
                "Secure Boot state cannot be read (no EFI variables: legacy BIOS boot or a container)",
                [f"{where} is missing"],
                "Nothing to do unless the host boots with UEFI Secure Boot; then run the doctor on the host itself.",
            )
        ]
    if not enabled:
        return []
    module = str((host.expect.get("driver") or {}).get("dkms_module") or "nvidia")
    running = running_kernel(host)
    kernels = [running] if host.path(f"/lib/modules/{running}").is_dir() else []
    if not kernels:
        kernels = sorted(p.name for p in host.path("/lib/modules").glob("*") if p.is_dir())
    unsigned = [f for k in kernels for f in _module_files(host, k, module) if not module_signed(f)]
    if not unsigned:
        return []
    return [
        Finding(
            "secure-boot-unsigned-module",
            "error",
            f"Secure Boot is on and the {module} module is not signed: the kernel refuses to load it",
            [f"{where}: Secure Boot = 1"] + [f"{host.shown(f)} has no appended module signature" for f in unsigned[:4]],
            "Re-run `./toolkit provision` (site.yml): under Secure Boot it has Ubuntu's DKMS sign "
            f"{module} with the host's machine owner key (made by `update-secureboot-policy --new-key`), queues the "
            "key's enrolment (password in /var/lib/msgpu/mok-enrolment-password) and says what to do at the next "
            "boot's MOK manager; or use Canonical's signed modules (nvidia_driver_module: precompiled). By hand: "
            "`sudo update-secureboot-policy --new-key`, `sudo update-secureboot-policy --enroll-key`, "
            f"`sudo dkms autoinstall` so DKMS signs {module}, reboot and enroll the key in the MOK manager; or turn "
            "Secure Boot off in the firmware.",
        )
    ]
