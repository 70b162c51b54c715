"""The run_check judge: run probe.py in the judged Python with a hard timeout and classify what it saw.

``classify`` is a pure function over the child's output, return code and timeout flag, so every
verdict is unit-testable with fake MindSpore packages. Standard library only.

On a GPU the judge then runs gpu_probe.py (the CUDA driver and NVML through ctypes, no framework) in a child of
its own with a short timeout (a broken driver can hang cuInit: never in the judge's process) and records it under
``driver_probe``. It only explains, it never changes a verdict: "the GPU works, MindSpore or its CUDA libraries are
at fault" against "the driver itself fails without MindSpore".
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._proc import ChildResult, find_result, run_child

STAGE_MARKER = "@@MSGPU_VERIFY_STAGE@@"
VERDICTS = ("OK", "NO_GPU", "LIBRARY_MISSING", "VERSION_MISMATCH", "HANG", "FAILED")

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
    said = run_check_said(stage_output(output, "run_check"), device)
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
    doctor (doctor.py, rule gpu-probe) both run the probe through this function."""
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


def driver_probe_sentence(verdict: str, record: Dict[str, Any]) -> Optional[str]:
    """What the driver probe adds to the judge's explanation (None: nothing to add). Never changes the verdict."""
    state = record.get("state")
    if state in ("timeout", "crashed"):
        return "The driver probe (no MindSpore) gave no answer: {}.".format(record.get("reason"))
    if state != "ran":
        return None
    probe_verdict = record.get("verdict")
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


def judge(
    python: str,
    device: str = "GPU",
    timeout_s: float = 120.0,
    expected: Optional[Dict[str, Optional[str]]] = None,
    env: Optional[Dict[str, str]] = None,
    driver_probe: bool = True,
    driver_probe_timeout_s: float = DRIVER_PROBE_TIMEOUT,
) -> Dict[str, Any]:
    """Run the probe in ``python`` and return the full judge JSON document; on a GPU (unless ``driver_probe`` is
    False) gpu_probe.py too, in its own child, under ``driver_probe``."""
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
    sentence = driver_probe_sentence(verdict["verdict"], probe_record)
    if sentence:
        verdict = dict(verdict, explanation=verdict["explanation"].rstrip() + " " + sentence)
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
