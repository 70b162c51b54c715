"""The driver rule: the loaded NVIDIA module and the user-space driver (libcuda, libnvidia-ml) against each other
and against the stack's minimum."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from .core import Finding, Host, read_text
from .linker import MULTIARCH_DIRS, ld_cache
from .probe_record import gpu_probe_record, probe_document, probe_line
from .versions import version_key

# /proc/driver/nvidia/version's first line names the release after "Kernel Module", for NVIDIA's
# proprietary module ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.00  Thu Oct 14 ...")
# and for the open kernel modules ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64
# 535.104.05  Release Build  (dvs-builder@...)  ...").
NVRM_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)\b")


def loaded_driver_version(host: Host) -> Tuple[Optional[str], str]:
    version = read_text(host.sys / "module/nvidia/version")
    if version and version.strip():
        return version.strip(), str(host.sys / "module/nvidia/version")
    version = nvrm_version(read_text(host.proc / "driver/nvidia/version") or "")
    if version:
        return version, str(host.proc / "driver/nvidia/version")
    return None, ""


def nvrm_version(text: str) -> Optional[str]:
    """The release in /proc/driver/nvidia/version, proprietary or open kernel module; None when absent."""
    match = NVRM_VERSION.search(text)
    return match.group(1) if match else None


def _library_dirs_version(name: str, paths: Iterable[str]) -> Optional[Tuple[str, str]]:
    """(version, path) of the first real file behind ``name`` (libcuda.so.1 -> libcuda.so.470.82.01)."""
    for path in paths:
        real = os.path.realpath(path)
        match = re.match(re.escape(name.split(".so")[0]) + r"\.so\.(\d+\.\d+(?:\.\d+)?)$", os.path.basename(real))
        if match:
            return match.group(1), real
    return None


def user_space_driver(host: Host, library: str) -> Optional[Tuple[str, str]]:
    soname = {"libcuda": "libcuda.so.1", "libnvidia-ml": "libnvidia-ml.so.1"}[library]
    candidates = [str(host.path(d) / soname) for d in MULTIARCH_DIRS]
    cached = ld_cache(host).get(soname)
    if cached:
        candidates.insert(0, str(host.path(cached)) if host.root != Path("/") else cached)
    existing = [c for c in candidates if os.path.exists(c)]
    found = _library_dirs_version(library, existing)
    if found:
        return found
    for folder in MULTIARCH_DIRS:
        for path in sorted(host.path(folder).glob(library + ".so.[0-9]*")):
            found = _library_dirs_version(library, [str(path)])
            if found:
                return found
    return None


def rule_driver(host: Host) -> List[Finding]:
    findings: List[Finding] = []
    loaded, loaded_from = loaded_driver_version(host)
    libcuda = user_space_driver(host, "libcuda")
    nvml = user_space_driver(host, "libnvidia-ml")
    no_gpu = bool(host.expect.get("no_gpu"))
    driver = host.expect.get("driver") or {}
    minimum = str(host.expect.get("minimum_driver") or driver.get("minimum") or "")
    cuda = (host.expect.get("cuda") or {}).get("version", "")
    probe = gpu_probe_record(host)
    probe_lines = [probe_line(host)] if probe.get("state") != "skipped" else []
    probe_nvml = probe_document(host).get("nvml") or {}
    # nvmlInit_v2 answers NVML_ERROR_LIB_RM_VERSION_MISMATCH (18), "Driver/library version mismatch", when the
    # loaded module and the user-space driver differ: the same fault nvidia-smi reports.
    nvml_refused = (
        str(probe_nvml.get("reason") or "")
        if not probe_nvml.get("available") and re.search(r"mismatch|\(18\)", str(probe_nvml.get("reason") or ""))
        else ""
    )
    if loaded is None and not no_gpu:
        findings.append(
            Finding(
                "driver-not-loaded",
                "error",
                "The NVIDIA kernel module is not loaded, so no program can reach the GPUs",
                [
                    f"{host.sys / 'module/nvidia/version'} and {host.proc / 'driver/nvidia/version'} are missing",
                    f"user-space driver library: {libcuda[1] if libcuda else 'libcuda.so.1 not found'}",
                    *probe_lines,
                ],
                "Load it: `sudo modprobe nvidia` (its error names the cause: nouveau, Secure Boot, no module for this "
                "kernel); after a driver install or upgrade, reboot (nvidia_driver_reboot: true lets "
                "`./toolkit provision` do it). On a host without GPUs on purpose set stack_no_gpu: true.",
            )
        )
    if libcuda is None:
        findings.append(
            Finding(
                "driver-user-space-missing",
                "error",
                "The NVIDIA driver's user-space library libcuda.so.1 is not installed",
                [f"not in the linker cache nor in {', '.join(MULTIARCH_DIRS[:2])}"],
                "Install the driver: `./toolkit provision` (role nvidia_driver; stack_driver_method "
                f"{driver.get('method') or 'distro'}, packages "
                f"{', '.join(driver.get('packages') or []) or 'libnvidia-compute-<branch>'}).",
            )
        )
    version, source = (loaded, loaded_from) if loaded else (libcuda if libcuda else (None, ""))
    if version and minimum and version_key(version) < version_key(minimum):
        findings.append(
            Finding(
                "driver-too-old",
                "error",
                f"Driver {version} is older than {minimum}, the minimum CUDA {cuda or '(stack)'} needs",
                [f"{source}: {version}", f"catalog: cuda {cuda} minimum_driver {minimum}"],
                f"Install a newer branch: set stack_driver_branch to one whose version is >= {minimum} "
                "(catalog/stacks.yml "
                f"`driver`; the stack's is {driver.get('branch') or '?'}) and run `./toolkit provision`, then reboot.",
            )
        )
    files_differ = bool(loaded and nvml and nvml[0] != loaded)
    if files_differ or (nvml_refused and not no_gpu):
        evidence = [f"{loaded_from}: {loaded}"] if loaded else []
        evidence += [f"{nvml[1]}: {nvml[0]}"] if nvml else []
        evidence += [f"NVML (gpu_probe.py): {nvml_refused}"] if nvml_refused else []
        findings.append(
            Finding(
                "nvml-mismatch",
                "error",
                f"NVML driver/library version mismatch: the loaded module is {loaded}, the user-space library "
                + (nvml[0] if nvml else "?")
                if files_differ
                else f"NVML driver/library version mismatch: {nvml_refused}",
                evidence,
                "The driver packages were upgraded but the old module is still loaded (nvidia-smi says 'Failed to "
                "initialize NVML: Driver/library version mismatch'): reboot, or stop every GPU process and "
                "`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`. nvidia_driver_hold: "
                "true keeps unattended upgrades from doing this again.",
            )
        )
    return findings
