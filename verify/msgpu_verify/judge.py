"""The run_check judge: run probe.py in the judged Python with a hard timeout and classify what it saw.

``classify`` is a pure function over the child's output, return code and timeout flag, so every
verdict is unit-testable with fake MindSpore packages. Standard library only.

On a GPU the judge then runs gpu_probe.py (the CUDA driver and NVML through ctypes, no framework) in a child of
its own with a short timeout (a broken driver can hang cuInit: never in the judge's process) and records it under
``driver_probe``. It only explains, it never changes a verdict: "the GPU works, MindSpore or its CUDA libraries are
at fault" against "the driver itself fails without MindSpore".

Given the stack's GPU code (``gpu_code``: the components list the preflight publishes as stack_resolved.gpu_code, each
component's measured SASS/PTX and the vendor's documented compute-capability range), the judge also runs compute.py's
rule on the compute capability the driver probe read for each GPU, and records it under ``compute``. A GPU the stack
cannot run on makes the verdict GPU_UNSUPPORTED, whatever MindSpore's own check said: this catches, after the driver
loads, a GPU that the preflight's PCI data did not know. GPU_UNSUPPORTED also comes from the real texts of a library
that refuses the GPU (CUDA's "no kernel image is available for execution on the device", cuDNN's
CUDNN_STATUS_ARCH_MISMATCH, TensorRT's "Unsupported SM").
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import compute
from ._proc import ChildResult, find_result, run_child

STAGE_MARKER = "@@MSGPU_VERIFY_STAGE@@"
VERDICTS = ("OK", "NO_GPU", "GPU_UNSUPPORTED", "LIBRARY_MISSING", "VERSION_MISMATCH", "HANG", "FAILED")

MISSING_LIBRARY = re.compile(r"(lib[\w.+-]+?\.so(?:\.[\w.]+)?): cannot open shared object file")
NO_GPU_PATTERNS = (
    re.compile(r"no CUDA-capable device is detected", re.IGNORECASE),
    re.compile(r"cudaGetDeviceCount failed, ret\[100\]"),
    re.compile(r"CUDA_ERROR_NO_DEVICE"),
    re.compile(r"cuda device count\W{0,4}(?:is\W{0,2})?0\b", re.IGNORECASE),
    re.compile(r"gpu device count\W{0,4}(?:is\W{0,2})?0\b", re.IGNORECASE),
)
OLD_DRIVER_PATTERNS = (
    re.compile(r"CUDA driver version is insufficient", re.IGNORECASE),
    re.compile(r"cudaErrorInsufficientDriver"),
    re.compile(r"ret\[35\]"),
    re.compile(r"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
)
# What a library says when it has no code for the GPU's architecture (compute capability), with a few words on who
# says it. CUDA's runtime: cudaGetErrorString(cudaErrorNoKernelImageForDevice, 209 since CUDA 10.1; 48 before) and
# the driver API's CUDA_ERROR_NO_BINARY_FOR_GPU (209) read "no kernel image is available for execution on the
# device"; MindSpore's GPU runtime logs it as "ret[209], <text>". cuDNN before 9 checks the GPU itself:
# cudnnGetErrorString(CUDNN_STATUS_ARCH_MISMATCH, 6). TensorRT logs "Unsupported SM: 0x809" (8.x on Ada: the SM as
# hex major/minor; 0x900 on Hopper), 7.x "Assertion Error in trtSmToCask: 0 (Unsupported SM.)", 10.x "Target GPU SM
# 61 is not supported by this TensorRT release".
GPU_UNSUPPORTED_PATTERNS = (
    (re.compile(r"no kernel image is available for execution on the device", re.IGNORECASE), "the CUDA runtime"),
    (re.compile(r"cudaErrorNoKernelImageForDevice|CUDA_ERROR_NO_BINARY_FOR_GPU"), "the CUDA runtime"),
    (re.compile(r"ret\[209\]"), "the CUDA runtime (error 209, no kernel image for this GPU)"),
    (re.compile(r"CUDNN_STATUS_ARCH_MISMATCH"), "cuDNN"),
    (re.compile(r"Unsupported SM(?::\s*0x[0-9A-Fa-f]+|\.)?"), "TensorRT"),
    (re.compile(r"Target GPU SM \d+ is not supported by this TensorRT release"), "TensorRT"),
)
# mindspore.run_check()'s own words, read from the real wheels (testbed/run_check_texts.py records them in
# tests/unit/data/run_check_texts.json, and the unit tests judge every one): 1.5.0, 1.5.1 and 1.10.0 print
#   "The result of multiplication calculation is correct, MindSpore has been installed successfully!"
# 2.0.0 (and 2.7.0; 2.2.14's wheel is not on PyPI) name the device it ran on, get_context('device_target'):
#   "The result of multiplication calculation is correct, MindSpore has been installed on platform [GPU] successfully!"
# Every release prints "MindSpore running check failed." and the exception's text when the multiplication raises.
RUN_CHECK_OK = re.compile(r"MindSpore has been installed (?:on platform \[(?P<platform>[^\]\n]*)\] )?successfully")
RUN_CHECK_FAILED = "MindSpore running check failed"
# How the 2.x unified wheel says its GPU plugin did not load (set_context(device_target="GPU") raises; measured with
# mindspore 2.0.0 on a host without CUDA): one line per plugin build, e.g.
#   "Load dynamic library: libmindspore_gpu.so.11.1 failed. libcublas.so.11: cannot open shared object file: ..."
GPU_PLUGIN_MISSING = re.compile(
    r"Load dynamic library: libmindspore_gpu\.so\.(?P<cuda>[\d.]+) failed\. "
    r"(?P<library>lib[\w.+-]+?\.so(?:\.[\w.]+)?): cannot open shared object file"
)
# The other devices' plugins (Ascend) fail to load on every GPU host: their libraries are not missing ones.
OTHER_PLUGIN = re.compile(r"Load dynamic library: libmindspore_(?!gpu)\w+\.so")

HINTS = {
    "OK": "Nothing to do.",
    "NO_GPU": "Check `nvidia-smi`, that the driver module is loaded (`lsmod | grep nvidia`), the host's GPUs "
    "and CUDA_VISIBLE_DEVICES; on hosts without a GPU on purpose set stack_no_gpu: true.",
    "LIBRARY_MISSING": "Run the provisioning again (playbooks/site.yml) and source the stack's env file "
    "/etc/msgpu/env/mindspore-<stack>.sh (it sources the CUDA one) so LD_LIBRARY_PATH holds the stack's CUDA, "
    "cuDNN and NCCL; `ldconfig -p | grep <library>` shows whether it is installed anywhere.",
    "VERSION_MISMATCH": "Source the stack's env file (/etc/msgpu/env/mindspore-<stack>.sh) so the right "
    "libraries come first, remove other CUDA/cuDNN copies from LD_LIBRARY_PATH (the wheel's RPATH also names "
    "/usr/local/cuda-<ver>/lib64: what that folder holds wins), reinstall the stack's MindSpore wheel, or "
    "upgrade the NVIDIA driver to the stack's branch.",
    "HANG": "Run the probe by hand (python -m msgpu_verify judge --timeout 600) and look at the last stage; "
    "a hang in import or run_check is often a wrong driver/library mix or a stuck GPU (check dmesg, nvidia-smi).",
    "GPU_UNSUPPORTED": "The stack's libraries carry no code for this GPU's compute capability (the explanation names "
    "the GPU, the library and what the stack's libraries support). Set stack_name: auto so the preflight picks a "
    "catalog stack that runs on every GPU of the host (playbooks/preflight.yml changes nothing and says which stack "
    "it picks and why), or choose a stack whose MindSpore, CUDA, cuDNN and TensorRT support this GPU "
    "(catalog/stacks.yml, `gpu:` of each version); then run playbooks/site.yml again.",
    "FAILED": "Read the output below; rerun `python -c 'import mindspore; mindspore.run_check()'` in the "
    "venv to see the full error.",
}


def stage_output(output: str, name: str) -> str:
    """Lines printed between the ``begin <name>`` and ``end <name>`` markers (to the end if no end)."""
    lines: List[str] = []
    inside = False
    for line in output.splitlines():
        if STAGE_MARKER in line:
            marker = line.split(STAGE_MARKER, 1)[1].strip()
            if marker == "begin " + name:
                inside = True
            elif marker == "end " + name:
                inside = False
            continue
        if inside:
            lines.append(line)
    return "\n".join(lines)


def last_stage(output: str) -> Optional[str]:
    found: Optional[str] = None
    for line in output.splitlines():
        if STAGE_MARKER in line:
            found = line.split(STAGE_MARKER, 1)[1].strip()
    return found


def clean_output(output: str) -> str:
    return "\n".join(line for line in output.splitlines() if "@@MSGPU_VERIFY_" not in line)


def _first(patterns: Sequence[re.Pattern], text: str) -> Optional[str]:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return match.group(0)
    return None


def run_check_said(text: str, device: str) -> Dict[str, Any]:
    """What run_check's output says: success (its success text and not its failure text) and, from 2.0 on, the
    platform it ran on; ``on_device`` only when that platform (where named) is the judged device."""
    match = RUN_CHECK_OK.search(text)
    said_ok = bool(match) and RUN_CHECK_FAILED not in text
    platform = match.group("platform") if match else None
    on_device = said_ok and (platform is None or platform.strip().upper() == device.upper())
    return {"said_ok": said_ok, "platform": platform, "on_device": on_device}


def missing_library(text: str, device: str, expected_cuda: Optional[str] = None) -> Optional[Tuple[str, Optional[str]]]:
    """(the shared library that could not be loaded, the 2.x GPU plugin that needed it or None), or None.

    The 2.x unified wheel tries one GPU plugin per CUDA it was built for (11.6, 11.1, 10.1 in 2.0.0): the one for the
    stack's CUDA names the library that matters; the Ascend plugins' failures never do on a GPU host.
    """
    if device.upper() == "GPU":
        plugins = list(GPU_PLUGIN_MISSING.finditer(text))
        if plugins:
            want = _cuda_major_minor(expected_cuda)
            chosen = next((m for m in plugins if m.group("cuda") == want), plugins[0])
            return chosen.group("library"), "libmindspore_gpu.so." + chosen.group("cuda")
    relevant = "\n".join(line for line in text.splitlines() if not OTHER_PLUGIN.search(line))
    match = MISSING_LIBRARY.search(relevant)
    return (match.group(1), None) if match else None


def gpu_refusal(text: str) -> Optional[Tuple[str, str]]:
    """(who refuses, the words it used) when a library says it has no code for the GPU (GPU_UNSUPPORTED_PATTERNS)."""
    for pattern, who in GPU_UNSUPPORTED_PATTERNS:
        match = pattern.search(text or "")
        if match:
            return who, match.group(0)
    return None


def _refusal_verdict(refusal: Tuple[str, str], context: str = "") -> Dict[str, Any]:
    who, words = refusal
    return _verdict(
        "GPU_UNSUPPORTED",
        f'MindSpore cannot compute on this GPU{context}: {who} says "{words}": the stack\'s libraries carry no code '
        "for the GPU's compute capability.",
    )


def _cuda_major_minor(version: Optional[str]) -> Optional[str]:
    if not version:
        return None
    parts = str(version).split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else parts[0]


def _loaded_version(libraries: List[Dict[str, Any]], name: str, main_file: str) -> Optional[str]:
    for lib in libraries:
        if lib.get("name") == name and str(lib.get("file", "")).startswith(main_file):
            return lib.get("version")
    return None


def _verdict(verdict: str, explanation: str, library: Optional[str] = None) -> Dict[str, Any]:
    return {"verdict": verdict, "explanation": explanation, "hint": HINTS[verdict], "library": library}


def _version_problems(result: Dict[str, Any], expected: Dict[str, Optional[str]]) -> List[str]:
    problems: List[str] = []
    libraries = result.get("loaded_libraries") or []
    want_ms = expected.get("mindspore")
    got_ms = result.get("mindspore_version")
    if want_ms and got_ms and got_ms != want_ms:
        problems.append(f"MindSpore {got_ms} is installed, expected {want_ms}")
    want_cuda = expected.get("cuda")
    got_cuda = _cuda_major_minor(_loaded_version(libraries, "libcudart", "libcudart.so"))
    if want_cuda and got_cuda and got_cuda != _cuda_major_minor(want_cuda):
        problems.append(f"the CUDA runtime actually loaded is {got_cuda}, expected {want_cuda}")
    want_cudnn = expected.get("cudnn_major")
    got_cudnn = _loaded_version(libraries, "libcudnn", "libcudnn.so")
    if want_cudnn and got_cudnn and got_cudnn.split(".")[0] != str(want_cudnn).split(".")[0]:
        problems.append(f"the cuDNN actually loaded is {got_cudnn}, expected major version {want_cudnn}")
    return problems


def classify(
    output: str,
    returncode: Optional[int],
    timed_out: bool,
    expected: Optional[Dict[str, Optional[str]]] = None,
    device: str = "GPU",
) -> Dict[str, Any]:
    """One verdict with a plain-words explanation and a hint, from what the probe child printed."""
    expected = expected or {}
    raw = find_result(output)
    result: Optional[Dict[str, Any]] = None
    if raw is not None:
        try:
            result = json.loads(raw)
        except ValueError:
            result = None
    text = clean_output(output)
    if result is None:
        if timed_out:
            where = last_stage(output) or "start-up"
            return _verdict("HANG", f"The check did not finish before the timeout (last stage: {where}).")
        missing = MISSING_LIBRARY.search(text)
        if missing:
            return _verdict(
                "LIBRARY_MISSING",
                f"The check crashed because {missing.group(1)} could not be loaded.",
                missing.group(1),
            )
        refusal = gpu_refusal(text)
        if refusal:
            return _refusal_verdict(refusal, " (the check crashed before reporting a result)")
        how = (
            f"was killed by signal {-returncode}"
            if returncode is not None and returncode < 0
            else (f"exited with code {returncode}")
        )
        return _verdict("FAILED", f"The check {how} before reporting a result.")

    errors = result.get("errors") or {}
    if result.get("fatal"):
        return _verdict("FAILED", "The probe itself failed: {}".format(result["fatal"].get("message")))
    if not result.get("imported"):
        error = errors.get("import") or {}
        message = "{}: {}".format(error.get("type"), error.get("message"))
        missing = MISSING_LIBRARY.search(message) or MISSING_LIBRARY.search(text)
        if missing:
            return _verdict(
                "LIBRARY_MISSING",
                f"`import mindspore` failed because the shared library {missing.group(1)} was not found.",
                missing.group(1),
            )
        refusal = gpu_refusal(message + "\n" + text)
        if refusal:
            return _refusal_verdict(refusal, " (`import mindspore` failed)")
        return _verdict("FAILED", f"`import mindspore` failed: {message.strip()}")

    context_error = errors.get("context")
    # With 2.x a GPU that cannot be used makes set_context(device_target=...) raise; the multiplication and run_check
    # then run on the CPU and pass, which proves nothing about the device.
    on_device = bool(result.get("mul_ok")) and not context_error
    if on_device:
        failure_text = stage_output(output, "run_check")
    else:
        messages = [str((errors.get(stage) or {}).get("message") or "") for stage in ("context", "mul")]
        failure_text = "\n".join([text, *messages])
        missing = missing_library(failure_text, device, expected.get("cuda"))
        if missing:
            library, plugin = missing
            needs = f"MindSpore's GPU plugin {plugin}" if plugin else f"computing on {device}"
            return _verdict(
                "LIBRARY_MISSING", f"MindSpore imports, but {needs} needs {library}, which was not found.", library
            )
    old_driver = _first(OLD_DRIVER_PATTERNS, failure_text) if not on_device else None
    problems = _version_problems(result, expected)
    if old_driver:
        problems.insert(0, "the NVIDIA driver is too old for this CUDA runtime (or not loaded): " + old_driver)
    if problems:
        return _verdict("VERSION_MISMATCH", "Version mismatch: " + "; ".join(problems) + ".")
    said = run_check_said(stage_output(output, "run_check"), device)
    if device.upper() == "GPU" and (not on_device or "run_check" in errors or not said["said_ok"]):
        messages = [str((error or {}).get("message") or "") for error in errors.values() if isinstance(error, dict)]
        refusal = gpu_refusal("\n".join([text, *messages]))
        if refusal:
            return _refusal_verdict(refusal)
    if not on_device:
        no_gpu = _first(NO_GPU_PATTERNS, failure_text) if device.upper() == "GPU" else None
        if no_gpu:
            return _verdict(
                "NO_GPU",
                f"MindSpore and its libraries load, but there is no usable GPU: {no_gpu}.",
            )
        if context_error:
            return _verdict(
                "FAILED",
                "MindSpore cannot compute on {}: set_context(device_target={!r}) raised {}: {}".format(
                    device, device, context_error.get("type"), str(context_error.get("message")).strip()[:500]
                ),
            )
        mul_error = errors.get("mul")
        if mul_error:
            return _verdict(
                "FAILED",
                "Multiplying [1,2,3]*[4,5,6] on {} raised {}: {}".format(
                    device, mul_error.get("type"), str(mul_error.get("message")).strip()[:500]
                ),
            )
        return _verdict(
            "FAILED",
            "Multiplying [1,2,3]*[4,5,6] on {} gave {}, not {}.".format(device, result.get("mul"), [4, 10, 18]),
        )
    if "run_check" in errors or not said["said_ok"]:
        return _verdict(
            "FAILED",
            f"The independent multiplication on {device} is right, but mindspore.run_check() did not report success.",
        )
    if not said["on_device"]:
        return _verdict(
            "FAILED",
            f"mindspore.run_check() passed on platform [{said['platform']}], not on {device}: MindSpore is not "
            f"computing on the {device}.",
        )
    return _verdict(
        "OK",
        "MindSpore {} imports, run_check passes and [1,2,3]*[4,5,6] = [4,10,18] on {}.".format(
            result.get("mindspore_version"), device
        ),
    )


DRIVER_PROBE_TIMEOUT = 60.0
# The judge's verdicts that the driver probe can explain (OK needs no explanation).
MINDSPORE_FAULTS = ("NO_GPU", "FAILED", "LIBRARY_MISSING", "VERSION_MISMATCH", "HANG")
DRIVER_FAILURES = ("NO_DRIVER", "NO_DEVICE", "DRIVER_ERROR", "KERNEL_FAILED")


def driver_probe_argv() -> List[str]:
    """gpu_probe.py by its path, in the judge's own interpreter: the file runs alone (no package needed)."""
    return [sys.executable, str(Path(__file__).resolve().with_name("gpu_probe.py"))]


def _gpu_names(devices: Any) -> List[str]:
    return [str(d.get("name") or "?") for d in devices or [] if isinstance(d, dict)]


def gpus_text(names: Sequence[str]) -> str:
    """Like "4 x NVIDIA GeForce RTX 3090", or "1 x Tesla T4, 2 x NVIDIA A100-PCIE-40GB" (first-seen order)."""
    counts: Dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{count} x {name}" for name, count in counts.items())


def skipped_driver_probe(reason: str) -> Dict[str, Any]:
    return {"state": "skipped", "verdict": None, "reason": reason, "summary": "skipped: " + reason}


def run_driver_probe(
    timeout_s: float = DRIVER_PROBE_TIMEOUT,
    env: Optional[Dict[str, str]] = None,
    argv: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    """gpu_probe.py in a child with a hard timeout; its verdict in a few fields and its whole JSON under ``document``
    (the doctor's GPU rules read cuInit's answer, each device's kernel and NVML from it). A timeout, a crash or a
    probe that cannot start is a recorded ``state`` ("timeout", "crashed"), never an exception. The judge and the
    doctor (doctor/probe_record.py, for its GPU rules) both run the probe through this function."""
    command = list(argv) if argv else driver_probe_argv()
    record: Dict[str, Any] = {"state": "ran", "verdict": None, "reason": None, "timeout_s": timeout_s}
    try:
        child = run_child(command, timeout_s=timeout_s, env=env, cwd="/")
    except OSError as exc:
        record.update(state="crashed", reason=f"cannot start the GPU probe: {exc}", seconds=0.0, returncode=None)
        record["summary"] = "crashed: " + record["reason"]
        return record
    document: Dict[str, Any] = {}
    for line in child.output.splitlines():
        if line.startswith("{"):
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            if isinstance(parsed, dict) and parsed.get("verdict"):
                document = parsed
    record.update(seconds=child.elapsed_s, returncode=child.returncode)
    if child.timed_out:
        record.update(
            state="timeout",
            reason=f"the GPU probe did not finish within {timeout_s:g} s (the driver hangs, e.g. in cuInit)",
            output_tail=child.output[-2000:],
        )
    elif not document:
        code = child.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        record.update(state="crashed", reason=f"the GPU probe {how} without a result", output_tail=child.output[-2000:])
    else:
        names = _gpu_names(document.get("devices"))
        nvml = document.get("nvml") if isinstance(document.get("nvml"), dict) else {}
        record.update(
            verdict=document.get("verdict"),
            reason=document.get("reason"),
            device_count=document.get("device_count"),
            devices=names,
            cuda_driver_version=document.get("cuda_driver_version"),
            driver_version=nvml.get("driver_version"),
            libcuda=document.get("libcuda"),
            document=document,
        )
    record["summary"] = driver_probe_text(record)
    return record


def driver_probe_text(record: Optional[Dict[str, Any]]) -> str:
    """The probe in a few words: "OK (4 x NVIDIA GeForce RTX 3090)", "NO_DEVICE", "timeout: ...", "skipped: ..."."""
    if not record:
        return "-"
    state = record.get("state")
    if state != "ran":
        return f"{state}: {record.get('reason')}"
    verdict = str(record.get("verdict"))
    names = record.get("devices") or []
    return f"{verdict} ({gpus_text(names)})" if verdict == "OK" and names else verdict


def probe_devices(record: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The devices of the driver probe's document (name, compute_capability, kernel), [] when it did not answer."""
    document = (record or {}).get("document") if (record or {}).get("state") == "ran" else None
    devices = document.get("devices") if isinstance(document, dict) else None
    return [d for d in devices or [] if isinstance(d, dict)]


def below_probe(device: Dict[str, Any]) -> bool:
    """A GPU the probe's own kernel (PTX for compute_50, compute.PROBE_PTX) cannot run on: its CC is below 5.0."""
    cc = compute.cc_tuple(device.get("compute_capability"))
    probe_cc = compute.cc_tuple(compute.PROBE_PTX)
    return bool(cc and probe_cc and cc < probe_cc)


def below_probe_text(device: Dict[str, Any]) -> str:
    return "compute capability {} is below what the probe (PTX {}) can run".format(
        compute.cc_text(device.get("compute_capability")), compute.PROBE_PTX
    )


def _devices_with_cc(devices: Sequence[Dict[str, Any]]) -> str:
    """Like "2 x NVIDIA H100 80GB HBM3 (CC 9.0)"."""
    return gpus_text(
        [
            "{} (CC {})".format(d.get("name") or "?", compute.cc_text(d["compute_capability"]))
            if d.get("compute_capability")
            else str(d.get("name") or "?")
            for d in devices
        ]
    )


def driver_probe_sentence(verdict: str, record: Dict[str, Any]) -> Optional[str]:
    """What the driver probe adds to the judge's explanation (None: nothing to add). Never changes the verdict."""
    state = record.get("state")
    if state in ("timeout", "crashed"):
        return "The driver probe (no MindSpore) gave no answer: {}.".format(record.get("reason"))
    if state != "ran":
        return None
    probe_verdict = record.get("verdict")
    devices = probe_devices(record)
    if probe_verdict == "OK" and verdict == "GPU_UNSUPPORTED":
        return (
            "The driver runs a CUDA kernel (PTX JIT-compiled for each GPU) on every GPU ({}) without MindSpore: the "
            "GPU works; the stack's libraries are what has no code for it.".format(
                _devices_with_cc(devices) or gpus_text(record.get("devices") or []) or "?"
            )
        )
    failed = [d for d in devices if not (d.get("kernel") or {}).get("ok")]
    if probe_verdict == "KERNEL_FAILED" and failed and all(below_probe(d) for d in failed):
        where, why = _devices_with_cc(failed), below_probe_text(failed[0])
        return f"The driver probe's kernel cannot run on {where}: {why}, which says nothing about the driver."
    if probe_verdict == "OK":
        if verdict not in MINDSPORE_FAULTS:
            return None
        return (
            "The driver runs a CUDA kernel on every GPU ({}) without MindSpore: the GPU works; the fault is in "
            "MindSpore or its CUDA libraries.".format(gpus_text(record.get("devices") or []) or "?")
        )
    if probe_verdict in DRIVER_FAILURES:
        if verdict == "NO_GPU" and probe_verdict == "NO_DEVICE":
            return "The driver probe (no MindSpore) agrees there is no usable GPU: {}.".format(record.get("reason"))
        return "The driver itself fails without MindSpore: {}.".format(record.get("reason"))
    return None


def gpu_code_support(components: Sequence[Dict[str, Any]]) -> str:
    """What the stack's libraries support, per component: the measured SASS/PTX of each GPU library, or the documented
    compute-capability range, e.g. "MindSpore 1.5.1 (libmindspore_gpu.so: SASS none; PTX 5.3); cuDNN 8.0.5 (CC 3.5 to
    8.6; newer 8.x untuned, nothing of 9.0 and up; NVIDIA cuDNN 8.0.5 support matrix)"."""

    def ccs(values: Any) -> str:
        parsed = sorted({c for c in (compute.cc_tuple(v) for v in values or []) if c})
        return ", ".join(f"{c[0]}.{c[1]}" for c in parsed) or "none"

    parts: List[str] = []
    for component in components or []:
        code = component.get("code") or {}
        said: List[str] = []
        for name, lib in sorted((code.get("libraries") or {}).items()):
            lib = lib or {}
            said.append(f"{name.rsplit('/', 1)[-1]}: SASS {ccs(lib.get('sass'))}; PTX {ccs(lib.get('ptx'))}")
        if code.get("sass") or code.get("ptx"):  # cited from the build flags where no wheel was read
            label = str(code.get("label") or "its kernels")
            said.append(f"{label}: SASS {ccs(code.get('sass'))}; PTX {ccs(code.get('ptx'))}")
        low, high = compute.cc_tuple(code.get("min")), compute.cc_tuple(code.get("max"))
        if low or high:
            span = "CC {} to {}".format(
                f"{low[0]}.{low[1]}" if low else "any", f"{high[0]}.{high[1]}" if high else "the newest"
            )
            above = str(code.get("above_max") or "none")
            if high and above == "jit":
                span += "; newer through PTX JIT"
            elif high and above == "same_major":
                span += f"; newer {high[0]}.x untuned, nothing of {high[0] + 1}.0 and up"
            elif high:
                span += "; nothing newer"
            said.append(span)
        if code.get("source"):
            said.append(str(code["source"]))
        name = f"{component.get('name', '?')} {component.get('version', '')}".strip()
        parts.append(f"{name} ({'; '.join(said)})" if said else name)
    return "; ".join(parts)


def probe_gpus(record: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The GPUs the driver probe read, as compute.check takes them: {"id": name, "cc", "slot": "device N [bus id]"};
    identical GPUs are grouped by name and compute capability. Devices without a compute capability are left out."""
    document = (record or {}).get("document") or {}
    nvml = document.get("nvml") if isinstance(document.get("nvml"), dict) else {}
    buses = {d.get("index"): d.get("pci_bus_id") for d in nvml.get("devices") or [] if isinstance(d, dict)}
    gpus = []
    for device in probe_devices(record):
        if not compute.cc_tuple(device.get("compute_capability")):
            continue
        bus = buses.get(device.get("index"))
        gpus.append(
            {
                "id": device.get("name") or "GPU",
                "name": "",
                "cc": device.get("compute_capability"),
                "slot": f"device {device.get('index')}" + (f" {bus}" if bus else ""),
            }
        )
    return gpus


# What the judge offers in place of a stack that cannot run on a GPU (compute.check's ``works``).
GPU_CODE_WORKS = (
    "set stack_name: auto, and the preflight picks a catalog stack that runs on every GPU of this host "
    "(playbooks/preflight.yml says which and why)"
)


def gpu_code_argument(value: str) -> List[Dict[str, Any]]:
    """``--gpu-code``: the components list as JSON text (``[...]``, what the verify role passes) or a JSON file's path;
    argparse's error (exit 2) when it is neither."""
    try:
        text = value if value.lstrip().startswith("[") else Path(value).read_text()
        parsed = json.loads(text)
    except (OSError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"--gpu-code wants a JSON list of components or a file holding one: {exc}"
        ) from None
    if not isinstance(parsed, list) or not all(isinstance(c, dict) for c in parsed):
        raise argparse.ArgumentTypeError("--gpu-code wants a JSON list of components ({name, version, code})")
    return parsed


def add_gpu_code_arguments(parser: argparse.ArgumentParser) -> None:
    """--gpu-code, --stack and --host, for the judge and gpu-smoke."""
    parser.add_argument(
        "--gpu-code",
        type=gpu_code_argument,
        help="the stack's GPU code (stack_resolved.gpu_code: JSON text or a file): checked against the compute "
        "capability the driver probe reads; a GPU the stack cannot run on is GPU_UNSUPPORTED",
    )
    parser.add_argument("--stack", default="", help="the stack's name, for the GPU code check's words")
    parser.add_argument("--host", default="", help="the host's name in those words (default: this host's name)")


def check_gpu_code(
    components: Optional[Sequence[Dict[str, Any]]],
    record: Optional[Dict[str, Any]],
    host: str = "",
    stack: str = "",
) -> Dict[str, Any]:
    """compute.check over the compute capability the driver probe read for each GPU: {"state": "checked", "errors",
    "warnings", "runs", "gpus", "supports"} or {"state": "skipped", "reason"}."""
    if not components:
        return {"state": "skipped", "reason": "no stack GPU code given (--gpu-code)"}
    gpus = probe_gpus(record)
    if not gpus:
        return {
            "state": "skipped",
            "reason": f"the driver probe read no compute capability ({driver_probe_text(record)})",
        }
    result = compute.check(components, gpus, host=host or socket.gethostname(), stack=stack, works=GPU_CODE_WORKS)
    result["gpus"] = [dict(g, problems=[list(p) for p in g.get("problems") or []]) for g in result["gpus"]]
    return dict(result, state="checked", stack=stack, supports=gpu_code_support(components))


def judge(
    python: str,
    device: str = "GPU",
    timeout_s: float = 120.0,
    expected: Optional[Dict[str, Optional[str]]] = None,
    env: Optional[Dict[str, str]] = None,
    driver_probe: bool = True,
    driver_probe_timeout_s: float = DRIVER_PROBE_TIMEOUT,
    gpu_code: Optional[Sequence[Dict[str, Any]]] = None,
    host: str = "",
    stack: str = "",
) -> Dict[str, Any]:
    """Run the probe in ``python`` and return the full judge JSON document; on a GPU (unless ``driver_probe`` is
    False) gpu_probe.py too, in its own child, under ``driver_probe``. With ``gpu_code`` (the stack's components,
    stack_resolved.gpu_code) compute.py's rule runs on the compute capability the driver probe read (``compute``): a
    GPU the stack cannot run on makes the verdict GPU_UNSUPPORTED."""
    expected = expected or {}
    probe = Path(__file__).resolve().with_name("probe.py")
    start = time.monotonic()
    try:
        child = run_child([python, str(probe), "--device", device], timeout_s=timeout_s, env=env, cwd="/")
    except OSError as exc:  # the judged Python itself is missing or not executable
        child = ChildResult(
            returncode=None, output=f"cannot start {python}: {exc}", timed_out=False, elapsed_s=0.0, pgid=0
        )
    verdict = classify(child.output, child.returncode, child.timed_out, expected, device)
    if child.returncode is None and not child.timed_out:
        verdict = _verdict("FAILED", child.output)
    elapsed_s = round(time.monotonic() - start, 3)
    if device.upper() != "GPU":
        probe_record = skipped_driver_probe(f"the judged device is {device}, not GPU")
    elif not driver_probe:
        probe_record = skipped_driver_probe("--no-driver-probe")
    else:
        probe_record = run_driver_probe(driver_probe_timeout_s, env=env)
    compute_record = (
        check_gpu_code(gpu_code, probe_record, host, stack)
        if device.upper() == "GPU"
        else {"state": "skipped", "reason": f"the judged device is {device}, not GPU"}
    )
    if compute_record.get("errors"):
        before = verdict
        compute_record["verdict_before"] = before["verdict"]
        verdict = _verdict(
            "GPU_UNSUPPORTED",
            " ".join(compute_record["errors"])
            + " The stack's libraries support: {}. MindSpore's own check said {}: {}".format(
                compute_record["supports"], before["verdict"], before["explanation"]
            ),
        )
    sentence = driver_probe_sentence(verdict["verdict"], probe_record)
    if sentence:
        verdict = dict(verdict, explanation=verdict["explanation"].rstrip() + " " + sentence)
    if compute_record.get("warnings"):
        verdict = dict(
            verdict, explanation=verdict["explanation"].rstrip() + " Note: " + " ".join(compute_record["warnings"])
        )
    raw = find_result(child.output)
    result: Dict[str, Any] = {}
    if raw:
        try:
            result = json.loads(raw)
        except ValueError:
            result = {}
    libraries = result.get("loaded_libraries") or []
    run_check_text = stage_output(child.output, "run_check")
    said = run_check_said(run_check_text, device)
    document: Dict[str, Any] = dict(verdict)
    document.update(
        {
            "device": device,
            "expected": {k: v for k, v in expected.items() if v},
            "got": {
                "mindspore": result.get("mindspore_version"),
                "cuda": _cuda_major_minor(_loaded_version(libraries, "libcudart", "libcudart.so")),
                "cudnn": _loaded_version(libraries, "libcudnn", "libcudnn.so"),
                "driver_cuda": _loaded_version(libraries, "libcuda", "libcuda.so"),
                "nccl": _loaded_version(libraries, "libnccl", "libnccl.so"),
                "mul": result.get("mul"),
            },
            "mindspore_version": result.get("mindspore_version"),
            "run_check": {
                "said_ok": said["said_ok"],
                "platform": said["platform"],
                "output": run_check_text[-8000:],
            },
            "loaded_libraries": [
                {key: lib.get(key) for key in ("name", "file", "path", "version", "version_source")}
                for lib in libraries
            ],
            "errors": result.get("errors") or {},
            "last_stage": last_stage(child.output),
            "output_tail": clean_output(child.output)[-6000:],
            "elapsed_s": elapsed_s,
            "driver_probe": probe_record,
            "compute": compute_record,
            "timeout_s": timeout_s,
            "timed_out": child.timed_out,
            "python": python,
            "returncode": child.returncode,
        }
    )
    return document


def exit_code(document: Dict[str, Any], accept: Sequence[str]) -> int:
    return 0 if document["verdict"] == "OK" or document["verdict"] in set(accept) else 1


def summary_line(document: Dict[str, Any]) -> str:
    return "judge: {} ({} s) {}".format(document["verdict"], document["elapsed_s"], document["explanation"])


def default_python() -> str:
    return sys.executable
