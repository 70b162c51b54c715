"""Runs INSIDE the judged Python (the MindSpore venv): import, run_check, an independent Mul, loaded libraries.

Standard library only; Python 3.8. Invoked as ``python probe.py --device GPU``. Prints stage markers and
one result line (marker + JSON) on stdout, then leaves with ``os._exit(0)`` so a MindSpore that hangs at
interpreter exit cannot turn a finished check into a hang. The parent merges stderr into stdout, so the
C++ (glog) lines MindSpore writes to fd 2 arrive in order between the stage markers.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

RESULT_MARKER = "@@MSGPU_VERIFY_RESULT@@"
STAGE_MARKER = "@@MSGPU_VERIFY_STAGE@@"
EXPECTED_PRODUCT = [4.0, 10.0, 18.0]
LIBRARY_PREFIXES = ("libcudart", "libcublas", "libcudnn", "libcuda", "libnccl")


def stage(name: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"{STAGE_MARKER} {name}", flush=True)


def error_text(exc: BaseException) -> Dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:],
    }


def library_name(path: str) -> Optional[str]:
    base = os.path.basename(path)
    for prefix in LIBRARY_PREFIXES:
        if re.match(re.escape(prefix) + r"(\.so|_|Lt)", base):
            return prefix
    return None


def loaded_paths() -> List[str]:
    paths: List[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if path.startswith("/") and path not in paths and library_name(path):
                        paths.append(path)
    except OSError:
        pass
    return paths


def _int_call(path: str, symbol: str) -> Optional[int]:
    try:
        lib = ctypes.CDLL(path)
        func = getattr(lib, symbol)
    except (OSError, AttributeError):
        return None
    value = ctypes.c_int(0)
    try:
        status = func(ctypes.byref(value))
    except Exception:
        return None
    return value.value if status == 0 else None


def _cuda_version(code: Optional[int]) -> Optional[str]:
    if not code:
        return None
    return f"{code // 1000}.{(code % 1000) // 10}"


def _cudnn_version(path: str) -> Optional[str]:
    try:
        func = ctypes.CDLL(path).cudnnGetVersion
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_size_t
    code = int(func())
    if code >= 10000:  # cuDNN 9: major*10000 + minor*100 + patch
        return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"
    return f"{code // 1000}.{(code % 1000) // 100}.{code % 100}"


def _nccl_version(path: str) -> Optional[str]:
    code = _int_call(path, "ncclGetVersion")
    if not code:
        return None
    if code >= 10000:
        return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"
    return f"{code // 1000}.{(code % 1000) // 100}.{code % 100}"


def _file_version(path: str) -> Optional[str]:
    match = re.search(r"\.so\.([0-9.]+)$", os.path.basename(os.path.realpath(path)))
    return match.group(1) if match else None


def _toolkit_json_version(path: str, key: str) -> Optional[str]:
    """The component's version from the toolkit's version.json (``<toolkit>/lib64/../version.json``)."""
    folder = os.path.dirname(os.path.realpath(path))
    for candidate in (os.path.join(folder, "..", "version.json"), os.path.join(folder, "..", "..", "version.json")):
        try:
            with open(candidate) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            continue
        version = (data.get(key) or {}).get("version") if isinstance(data, dict) else None
        if version:
            return str(version)
    return None


def library_report(path: str) -> Dict[str, Any]:
    """Name, path and version of one loaded library; ``version_source`` says where the version came from."""
    name = library_name(path) or os.path.basename(path)
    base = os.path.basename(path)
    version: Optional[str] = None
    source = "ctypes"
    if name == "libcudart":
        version = _cuda_version(_int_call(path, "cudaRuntimeGetVersion"))
    elif name == "libcuda":
        version = _cuda_version(_int_call(path, "cuDriverGetVersion"))
    elif name == "libcudnn" and base.startswith("libcudnn.so"):
        version = _cudnn_version(path)
    elif name == "libnccl":
        version = _nccl_version(path)
    if version is None:
        # libcudart.so.11.0 is only the soname (every CUDA 11.x has it): a file name says the release only
        # when it has three parts (libcudart.so.11.1.74); otherwise ask the toolkit's version.json.
        source = "file name"
        version = _file_version(path)
        if name == "libcudart" and (version is None or version.count(".") < 2):
            json_version = _toolkit_json_version(path, "cuda_cudart")
            version, source = (json_version, "version.json") if json_version else (None, None)
    return {
        "name": name,
        "file": base,
        "path": path,
        "realpath": os.path.realpath(path),
        "version": version,
        "version_source": source if version else None,
    }


def run_stage(result: Dict[str, Any], name: str, func: Callable[[], Any]) -> Any:
    """One stage between markers; its seconds go to ``stage_seconds`` (the first GPU stage carries the
    CUDA context and, on a cold kernel cache, the driver's JIT compilation: msgpu_verify.warmup reads them)."""
    stage("begin " + name)
    start = time.monotonic()
    try:
        return func()
    except BaseException as exc:
        result.setdefault("errors", {})[name] = error_text(exc)
        return None
    finally:
        result.setdefault("stage_seconds", {})[name] = round(time.monotonic() - start, 3)
        stage("end " + name)


def probe(device: str) -> Dict[str, Any]:
    result: Dict[str, Any] = {"device": device, "python": sys.executable, "pid": os.getpid()}
    start = time.monotonic()
    ms = run_stage(result, "import", lambda: __import__("mindspore"))
    result["imported"] = ms is not None
    if ms is not None:
        result["mindspore_version"] = getattr(ms, "__version__", None)
        result["mindspore_file"] = getattr(ms, "__file__", None)

        def set_device() -> bool:
            ms.context.set_context(mode=ms.context.PYNATIVE_MODE, device_target=device)
            return True

        result["context_set"] = bool(run_stage(result, "context", set_device))
        run_stage(result, "run_check", ms.run_check)

        def multiply() -> List[float]:
            x = ms.Tensor([1.0, 2.0, 3.0], ms.float32)
            y = ms.Tensor([4.0, 5.0, 6.0], ms.float32)
            return [float(v) for v in ms.ops.Mul()(x, y).asnumpy().tolist()]

        product = run_stage(result, "mul", multiply)
        result["mul"] = product
        result["mul_ok"] = product == EXPECTED_PRODUCT
    result["loaded_libraries"] = [library_report(path) for path in loaded_paths()]
    result["elapsed_s"] = round(time.monotonic() - start, 3)
    return result


def main(argv: List[str]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    device = argv[argv.index("--device") + 1] if "--device" in argv else "GPU"
    try:
        result = probe(device)
    except BaseException as exc:
        result = {"device": device, "fatal": error_text(exc)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, (RESULT_MARKER + " " + json.dumps(result) + "\n").encode("utf-8"))
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
