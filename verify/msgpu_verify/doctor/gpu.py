"""The gpu-probe rule: what the GPU probe (libcuda and NVML without any framework) says is wrong with the
driver or the GPUs: cuInit's CUresult in plain words, no device, a kernel that fails, the running driver's release,
ECC."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from .core import Finding, Host
from .driver import loaded_driver_version, user_space_driver
from .kernel import loaded_modules
from .probe_record import gpu_probe_record, probe_document, probe_line, sibling_module

# What a CUresult from cuInit, cuDeviceGetCount or the probe's kernel steps means on a GPU host, in plain words
# (cuda.h's CUresult values; gpu_probe.py names them through the driver's cuGetErrorName).
CUDA_MEANINGS = {
    2: "the GPU's memory is exhausted (other processes hold it: `nvidia-smi` lists them)",
    3: "the CUDA driver is not initialized: cuInit failed earlier in this process",
    35: "the CUDA driver library (libcuda) is newer than the loaded NVIDIA kernel module can serve",
    46: "the GPUs are busy or unavailable: compute mode Exclusive_Process/Prohibited (`nvidia-smi -q -d COMPUTE`)",
    100: "the driver sees no CUDA-capable GPU (no /dev/nvidia<N>, CUDA_VISIBLE_DEVICES hides them, or the GPUs "
    "fell off the bus: `sudo dmesg | grep -i xid`)",
    101: "a device ordinal that does not exist (CUDA_VISIBLE_DEVICES names a GPU the host does not have)",
    209: "no kernel image for this GPU",
    218: "the driver cannot JIT-compile PTX (a broken or mismatched libnvidia-ptxjitcompiler)",
    222: "the PTX is newer than this driver supports",
    304: "an operating-system call failed: usually /dev/nvidia* cannot be opened (permissions, or a container "
    "without the devices)",
    719: "the kernel crashed on the GPU (a hardware or driver fault: `sudo dmesg | grep -i xid`)",
    802: "the system is not ready: on NVSwitch hosts nvidia-fabricmanager is not running",
    803: "libcuda and the loaded NVIDIA kernel module are from different driver releases",
    804: "libcuda is a forward-compatibility copy (cuda-compat) this GPU does not support",
    999: "the driver failed without saying why: often nvidia_uvm is not loaded (or needs reloading after a "
    "suspend), or a GPU in a bad state",
}


def cuda_code_text(code: Any, name: Any) -> str:
    """A CUresult and what it means, e.g. "CUDA_ERROR_UNKNOWN (999): the driver failed without saying why..."."""
    meaning = CUDA_MEANINGS.get(code) if isinstance(code, int) else None
    return f"{name} ({code})" + (f": {meaning}" if meaning else "")


def _error_code(text: str) -> Optional[int]:
    """The CUresult in gpu_probe's "CUDA_ERROR_LAUNCH_FAILED (719)"."""
    match = re.search(r"\((\d+)\)\s*$", text or "")
    return int(match.group(1)) if match else None


PROBE_FIX_RERUN = (
    "`python3 -m msgpu_verify gpu-probe --pretty` (or `python3 gpu_probe.py --pretty`) shows the probe's answer."
)


def rule_gpu_probe(host: Host) -> List[Finding]:
    """What the GPU probe (libcuda and NVML without any framework) says is wrong with the driver or the GPUs. On a
    host without GPUs on purpose (stack_no_gpu) its answer is recorded in the document, never a finding."""
    record = gpu_probe_record(host)
    if host.expect.get("no_gpu"):
        return []
    state = record.get("state")
    if state in ("timeout", "crashed"):
        return [
            Finding(
                "gpu-probe-no-answer",
                "error" if state == "timeout" else "warning",
                "The GPU probe (libcuda through ctypes, no MindSpore) gave no answer: "
                + ("the driver hangs" if state == "timeout" else "it crashed"),
                [probe_line(host)]
                + ([f"it printed: {record['output_tail'][-300:]}"] if record.get("output_tail") else []),
                "A driver that hangs in cuInit or crashes the process is stuck or broken: look for Xid errors "
                "(`sudo dmesg | grep -i -e xid -e nvrm`), check `nvidia-smi`, stop GPU processes and reload the "
                "module (`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`) or reboot. "
                + PROBE_FIX_RERUN,
            )
        ]
    document = probe_document(host)
    if not document:
        return []
    verdict = document.get("verdict")
    findings: List[Finding] = []
    nvml = document.get("nvml") if isinstance(document.get("nvml"), dict) else {}
    nvml_line = (
        f"NVML: driver {nvml.get('driver_version')}"
        if nvml.get("available")
        else f"NVML: {nvml.get('reason') or 'not asked'}"
    )
    if verdict == "NO_DRIVER" and user_space_driver(host, "libcuda") is not None:
        findings.append(
            Finding(
                "cuda-driver-unloadable",
                "error",
                "libcuda.so.1 is installed, but it cannot be loaded",
                [probe_line(host)],
                "The driver's user-space libraries are broken or from another architecture: reinstall the driver "
                "(`./toolkit provision`, role nvidia_driver), and check `ldd $(ldconfig -p | awk '/libcuda.so.1 /"
                "{print $NF; exit}')` for what it lacks. " + PROBE_FIX_RERUN,
            )
        )
    elif verdict == "NO_DEVICE" and loaded_driver_version(host)[0] is not None:
        findings.append(
            Finding(
                "cuda-no-device",
                "error",
                "The NVIDIA module is loaded, but the CUDA driver sees no GPU",
                [probe_line(host), *_init_lines(document), nvml_line, _visible_line(host)],
                "Check that /dev/nvidia0.. exist and are readable (`ls -l /dev/nvidia*`; "
                "`sudo nvidia-modprobe -u -c=0` creates them), that CUDA_VISIBLE_DEVICES does not hide the GPUs, "
                "and the kernel log for GPUs that fell off the bus (`sudo dmesg | grep -i xid`, Xid 79: reseat or "
                "power-cycle). " + PROBE_FIX_RERUN,
            )
        )
    elif verdict == "DRIVER_ERROR":
        findings.append(_driver_error(host, document, nvml_line))
    elif verdict == "KERNEL_FAILED":
        devices = [d for d in document.get("devices") or [] if isinstance(d, dict)]
        failed = [d for d in devices if not (d.get("kernel") or {}).get("ok")]
        # The probe's kernel is PTX for compute_50 (compute.PROBE_PTX): on an older GPU it cannot run at all, which
        # says nothing about the driver or the GPU.
        below = [d for d in failed if _below_probe(d)]
        failed = [d for d in failed if d not in below]
        if below:
            findings.append(_below_probe_finding(below, len(devices), nvml_line))
        lines = []
        for device in failed:
            kernel = device.get("kernel") or {}
            error = str(kernel.get("error") or "")
            code = _error_code(error)
            meaning = CUDA_MEANINGS.get(code) if code is not None else None
            lines.append(
                "GPU {} ({}, compute capability {}): {} failed: {}{}".format(
                    device.get("index"),
                    device.get("name") or "?",
                    device.get("compute_capability") or "?",
                    kernel.get("step"),
                    error,
                    f" - {meaning}" if meaning else "",
                )
            )
        if failed:
            findings.append(
                Finding(
                    "gpu-kernel-failed",
                    "error",
                    f"A tiny CUDA kernel fails on {len(failed)} of {len(devices)} GPU(s) without any framework: the "
                    "driver or the GPU is at fault, not MindSpore",
                    [*lines, nvml_line],
                    "Look for Xid errors (`sudo dmesg | grep -i -e xid -e nvrm`) and ECC errors (`nvidia-smi -q -d "
                    "ECC`), check the GPU's power and cooling, reset it (`sudo nvidia-smi -r -i <index>`, no process "
                    "may use it) or reboot; a GPU that keeps failing needs service. " + PROBE_FIX_RERUN,
                )
            )
    findings += _driver_version_findings(host, nvml)
    findings += _ecc_findings(nvml)
    return findings


def _probe_cc(device: Dict[str, Any]) -> Tuple[Optional[Tuple[int, int]], str]:
    """A probe device's compute capability as a tuple (compute.cc_tuple) and as text; (None, "?") unknown."""
    compute, _ = sibling_module("compute")
    cc = compute.cc_tuple(device.get("compute_capability")) if compute is not None else None
    return cc, (f"{cc[0]}.{cc[1]}" if cc else str(device.get("compute_capability") or "?"))


def _below_probe(device: Dict[str, Any]) -> bool:
    """A GPU whose compute capability is below the probe's PTX target (compute.PROBE_PTX, 5.0)."""
    compute, _ = sibling_module("compute")
    cc = _probe_cc(device)[0]
    return bool(compute is not None and cc and cc < compute.cc_tuple(compute.PROBE_PTX))


def _below_probe_finding(below: List[Dict[str, Any]], total: int, nvml_line: str) -> Finding:
    compute, _ = sibling_module("compute")
    ptx = compute.PROBE_PTX if compute is not None else "5.0"
    lines = [
        "GPU {} ({}): {} failed: {}: compute capability {} is below what the probe (PTX {}) can run".format(
            d.get("index"),
            d.get("name") or "?",
            (d.get("kernel") or {}).get("step"),
            (d.get("kernel") or {}).get("error"),
            _probe_cc(d)[1],
            ptx,
        )
        for d in below
    ]
    ccs = sorted({_probe_cc(d)[1] for d in below})
    return Finding(
        "gpu-below-probe",
        "warning",
        f"The GPU probe cannot check {len(below)} of {total} GPU(s): compute capability {', '.join(ccs)} is below what "
        f"the probe (PTX {ptx}) can run",
        [*lines, nvml_line],
        "This blames neither the driver nor the GPU: the probe's test kernel is PTX for compute_"
        f"{ptx.replace('.', '')}, which the driver cannot build for an older GPU, so the probe says nothing about it "
        "(`nvidia-smi` shows whether the driver serves it). Whether the stack's libraries run on it is the "
        "gpu-unsupported finding's answer (the GPU's compute capability against the stack's code); CUDA 12 has no "
        "code for compute capability below 5.0 at all.",
    )


def _init_lines(document: Dict[str, Any]) -> List[str]:
    lines = []
    for step in ("cuInit", "cuDeviceGetCount"):
        result = document.get(f"{step}_result")
        if isinstance(result, dict) and result.get("code"):
            lines.append(f"{step} returned {cuda_code_text(result.get('code'), result.get('name'))}")
    return lines


def _visible_line(host: Host) -> str:
    value = host.environ.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    return f"the doctor's CUDA_VISIBLE_DEVICES={value!r}" if value is not None else "CUDA_VISIBLE_DEVICES unset"


def _driver_error(host: Host, document: Dict[str, Any], nvml_line: str) -> Finding:
    lines = _init_lines(document)
    codes = [
        (document.get(f"{step}_result") or {}).get("code")
        for step in ("cuInit", "cuDeviceGetCount")
        if isinstance(document.get(f"{step}_result"), dict)
    ]
    code = next((c for c in codes if c), None)
    evidence = [probe_line(host), *lines, nvml_line]
    loaded, loaded_from = loaded_driver_version(host)
    libcuda = user_space_driver(host, "libcuda")
    if loaded:
        evidence.append(f"{loaded_from}: {loaded}")
    if libcuda:
        evidence.append(f"{libcuda[1]}: {libcuda[0]}")
    modules = loaded_modules(host)
    fix = {
        3: "Reload the driver or reboot; then run the doctor again.",
        35: "The kernel module is older than libcuda: reboot into the installed driver (an upgrade without reboot "
        "leaves the old module loaded), or reinstall the branch's packages with `./toolkit provision`.",
        802: "Start the fabric manager at exactly the driver's version: `sudo systemctl enable --now "
        "nvidia-fabricmanager` (`./toolkit provision` installs it on NVSwitch hosts), then run the doctor again.",
        803: "Reboot so the kernel module matches the installed libcuda (or stop every GPU process and `sudo rmmod "
        "nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`); nvidia_driver_hold: true keeps "
        "unattended upgrades from doing this again.",
        804: "Remove the forward-compatibility libcuda (package cuda-compat-*, or /usr/local/cuda*/compat on "
        "LD_LIBRARY_PATH): this GPU needs the driver's own libcuda.",
        304: "Check /dev/nvidia* (`ls -l /dev/nvidia*`: readable and writable by the user) and, in a container, "
        "that the devices are passed in.",
        999: "Reload nvidia_uvm (`sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm`) or reboot; look for Xid "
        "errors (`sudo dmesg | grep -i xid`).",
    }.get(
        code if isinstance(code, int) else -1,
        "Look for Xid errors (`sudo dmesg | grep -i -e xid -e nvrm`) and "
        "reinstall or reload the driver (`./toolkit provision`, then reboot).",
    )
    if code == 999 and modules is not None and "nvidia_uvm" not in modules:
        evidence.append(f"{host.proc / 'modules'}: nvidia_uvm is not loaded")
        fix = "Load it: `sudo modprobe nvidia_uvm` (CUDA needs it; /dev/nvidia-uvm appears with it). " + fix
    if code:
        step = "cuInit" if (document.get("cuInit_result") or {}).get("code") else "cuDeviceGetCount"
        name = (document.get(f"{step}_result") or {}).get("name")
        title = f"The CUDA driver fails before any framework: {step} returned {name} ({code})"
        meaning = CUDA_MEANINGS.get(code)
        if meaning:
            title += f": {meaning}"
    else:
        title = "The CUDA driver library is not usable: " + str(document.get("reason"))
    return Finding("cuda-init-failed", "error", title, evidence, fix + " " + PROBE_FIX_RERUN)


def _driver_version_findings(host: Host, nvml: Dict[str, Any]) -> List[Finding]:
    """The driver NVML reports (the running one) against the catalog's: the branch, or for the runfile method the
    exact release."""
    running = str(nvml.get("driver_version") or "") if nvml.get("available") else ""
    driver = host.expect.get("driver") or {}
    branch = str(driver.get("branch") or "")
    method = str(driver.get("method") or "")
    version = str(driver.get("version") or "")
    if not running:
        return []
    if method == "runfile" and version and running != version:
        wanted = f"the runfile's {version}"
    elif re.fullmatch(r"\d+", branch) and running.split(".")[0] != branch:
        wanted = f"branch {branch} ({method or 'the stack'}'s {', '.join(driver.get('packages') or []) or 'driver'})"
    else:
        return []
    return [
        Finding(
            "driver-version-unexpected",
            "warning",
            f"The running driver is {running}, the stack installs {wanted}",
            [f"NVML (gpu_probe.py) nvmlSystemGetDriverVersion: {running}", f"catalog: driver {json.dumps(driver)}"],
            "Another driver was installed by hand or by another tool, or the host was not rebooted after "
            "`./toolkit provision` changed the branch: run `./toolkit provision` (it installs stack_driver_branch "
            f"{branch or '?'} and removes other branches' packages) and reboot; or set stack_driver_branch to the "
            "branch you want.",
        )
    ]


def _ecc_findings(nvml: Dict[str, Any]) -> List[Finding]:
    """ECC off on GPUs that have it (NVML; GeForce cards answer "not supported" and are left alone)."""
    devices = [d for d in nvml.get("devices") or [] if isinstance(d, dict)] if nvml.get("available") else []
    off = [d for d in devices if d.get("ecc") == "off"]
    if not off:
        return []
    return [
        Finding(
            "ecc-off",
            "info",
            f"ECC is off on {len(off)} of {len(devices)} GPU(s) that support it: memory errors go unnoticed",
            [
                "NVML (gpu_probe.py) nvmlDeviceGetEccMode: GPU {} {}({}): off".format(
                    d.get("index"), f"{d['pci_bus_id']} " if d.get("pci_bus_id") else "", d.get("name") or "?"
                )
                for d in off
            ],
            "If the GPUs should correct memory errors (data-centre GPUs ship with ECC on): `sudo nvidia-smi -e 1` "
            "and reboot. ECC off gives a little more memory and bandwidth; leave it if that was chosen.",
        )
    ]
