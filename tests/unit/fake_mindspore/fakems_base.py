"""A tiny stand-in for the parts of MindSpore the judge's probe touches, in several broken ways.

Each variant's ``mindspore/__init__.py`` calls ``install(globals(), "<mode>"[, "<release>"])``. Modes: ok, wrong,
nogpu, nokernel and cudnnarch (a GPU the stack's libraries have no code for: CUDA's and cuDNN's real words in
MindSpore's formats), exit_hang, noplugin, jit (the first GPU operation of a process "JIT-compiles": it sleeps
MSGPU_FAKE_JIT_S seconds, 1 by default, unless the kernel cache folder - CUDA_CACHE_PATH, else ~/.nv/ComputeCache -
already holds what it "compiled", which it then writes there; a large MSGPU_FAKE_JIT_S is a compilation that never
ends).
(hang and missing_lib break at import time in their own __init__.) The release (1.5.1 by
default, or 2.0.0) decides what run_check prints: the real wheel's own texts, rendered from the templates that
testbed/run_check_texts.py read out of it (tests/unit/data/run_check_texts.json), and whether the 2.x top-level
names (set_context, get_context, GRAPH_MODE) exist.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import types
from pathlib import Path

TEXTS = Path(__file__).resolve().parent.parent / "data" / "run_check_texts.json"

# What real mindspore-gpu 1.5.1 prints without a GPU (captured in the sandbox): the glog lines go to
# fd 2 from C++, the rest is Python print() output of run_check.
GLOG_NO_GPU = (
    "[ERROR] DEVICE(16183,7f1a1a853740,python):2026-11-29-19:52:24.375.794 "
    "[mindspore/ccsrc/runtime/device/gpu/cuda_driver.cc:237] device_count] cudaGetDeviceCount failed, ret[100], "
    "no CUDA-capable device is detected\n"
    "[ERROR] DEVICE(16183,7f1a1a853740,python):2026-11-29-19:52:24.375.832 "
    "[mindspore/ccsrc/runtime/device/gpu/cuda_driver.cc:245] SetDevice] SetDevice for id:0 failed, ret[100], "
    "no CUDA-capable device is detected. Please make sure that the 'device_id' set in context is in the "
    "range:[0, total number of GPU).\n"
    "[EXCEPTION] DEVICE(16183,7f1a1a853740,python):2026-11-29-19:52:24.375.843 "
    "[mindspore/ccsrc/runtime/device/gpu/gpu_device_manager.cc:27] InitDevice] Op Error: Failed to set current "
    "device id | Error Number: 0\n"
)
# What real mindspore 2.0.0 (the unified CPU + GPU wheel) says on a host without CUDA (captured on the controller):
# at import, run_check/_check_version.py logs these to fd 2; then set_context(device_target="GPU") raises, the context
# stays on the CPU, and run_check and the multiplication pass there.
GLOG_NO_PLUGIN = (
    "[ERROR] ME(5236:139899921234816,MainProcess):2026-12-01-15:41:44.227.645 "
    "[mindspore/run_check/_check_version.py:218] libcuda.so (need by mindspore-gpu) is not found. Please confirm "
    "that libmindspore_gpu.so is in directory:/venv/lib/python3.8/site-packages/mindspore/run_check/../lib/plugin "
    "and the correct cuda version has been installed, you can refer to the installation guidelines: "
    "https://www.mindspore.cn/install\n"
    "[ERROR] ME(5236:139899921234816,MainProcess):2026-12-01-15:41:44.227.843 "
    "[mindspore/run_check/_check_version.py:218] libcudnn.so (need by mindspore-gpu) is not found. Please confirm "
    "that libmindspore_gpu.so is in directory:/venv/lib/python3.8/site-packages/mindspore/run_check/../lib/plugin "
    "and the correct cuda version has been installed, you can refer to the installation guidelines: "
    "https://www.mindspore.cn/install\n"
)
UNSUPPORTED_GPU = (
    "Unsupported device target GPU. This process only supports one of the ['CPU']. Please check whether the GPU "
    "environment is installed and configured correctly, and check whether current mindspore wheel package was built "
    'with "-e GPU". For details, please refer to "Device load error message".\n\n'
    "----------------------------------------------------\n"
    "- Device load error message:\n"
    "----------------------------------------------------\n"
    "Load dynamic library: libmindspore_ascend.so.2 failed. libge_runner.so: cannot open shared object file: No such "
    "file or directory\n"
    "Load dynamic library: libmindspore_ascend.so.1 failed. libge_runner.so: cannot open shared object file: No such "
    "file or directory\n"
    "Load dynamic library: libmindspore_gpu.so.11.6 failed. libcublas.so.11: cannot open shared object file: No such "
    "file or directory\n"
    "Load dynamic library: libmindspore_gpu.so.11.1 failed. libcublas.so.11: cannot open shared object file: No such "
    "file or directory\n"
    "Load dynamic library: libmindspore_gpu.so.10.1 failed. libcublas.so.10: cannot open shared object file: No such "
    "file or directory\n\n"
    "----------------------------------------------------\n"
    "- C++ Call Stack: (For framework developers)\n"
    "----------------------------------------------------\n"
    "mindspore/core/utils/ms_context.cc:318 SetDeviceTargetFromInner\n"
)
# A GPU the stack's libraries have no code for, in MindSpore's own formats (mindspore/ccsrc/runtime/device/gpu/
# cuda_driver.cc: MS_LOG(ERROR) << "cudaStreamSynchronize failed, ret[" << ret << "], " << cudaGetErrorString(ret);
# gpu_common.h: "CUDA Error: <message> | Error Number: <status> <cudaGetErrorString>" and "cuDNN Error: <message> |
# Error Number: <status> <cudnnGetErrorString>"), with the libraries' real strings: cudaErrorNoKernelImageForDevice
# (209) reads "no kernel image is available for execution on the device", CUDNN_STATUS_ARCH_MISMATCH is status 6.
GLOG_NO_KERNEL_IMAGE = (
    "[ERROR] DEVICE(20417,7f3c1b7fe700,python):2026-12-02-10:14:31.562.113 "
    "[mindspore/ccsrc/runtime/device/gpu/cuda_driver.cc:212] SyncStream] cudaStreamSynchronize failed, ret[209], "
    "no kernel image is available for execution on the device\n"
)
NO_KERNEL_IMAGE_ERROR = (
    "mindspore/ccsrc/runtime/device/gpu/gpu_kernel_runtime.cc:620 SyncStream] CUDA Error: cudaStreamSynchronize "
    "failed | Error Number: 209 no kernel image is available for execution on the device"
)
CUDNN_ARCH_ERROR = (
    "mindspore/ccsrc/runtime/device/gpu/gpu_device_manager.cc:38 InitDevice] cuDNN Error: Failed to create cuDNN "
    "handle | Error Number: 6 CUDNN_STATUS_ARCH_MISMATCH"
)
INIT_DEVICE_ERROR = (
    "mindspore/ccsrc/runtime/device/gpu/gpu_device_manager.cc:27 InitDevice] Op Error: "
    "Failed to set current device id | Error Number: 0"
)


class _Array:
    def __init__(self, values):
        self._values = list(values)

    def tolist(self):
        return list(self._values)


class Tensor:
    def __init__(self, values, dtype=None):
        self.values = [float(v) for v in values]
        self.dtype = dtype

    def asnumpy(self):
        return _Array(self.values)


def real_prints(release: str) -> dict:
    """run_check's print templates as the real wheel of ``release`` has them."""
    return json.loads(TEXTS.read_text())["releases"][release]["run_check"]


def render(template: str, values: dict) -> str:
    """A template's ``{expression}`` parts replaced by what that expression gives here (a KeyError if unknown)."""
    return re.sub(r"\{([^{}]+)\}", lambda match: str(values[match.group(1)]), template)


def install(namespace: dict, mode: str, release: str = "1.5.1") -> None:
    two = release.startswith("2.")
    # 1.5 starts on the GPU target in a GPU build; the 2.x unified wheel on the CPU until set_context says otherwise.
    state = {"device": "CPU" if two else "GPU"}
    texts = real_prints(release)

    def set_context(**kwargs):
        target = kwargs.get("device_target", state["device"])
        if mode == "noplugin" and target == "GPU":
            raise RuntimeError(UNSUPPORTED_GPU)
        state["device"] = target

    def get_context(key):
        return state["device"] if key == "device_target" else state.get(key)

    def jit_once():
        if state.get("jitted"):
            return
        state["jitted"] = True
        home = os.environ.get("HOME") or os.path.expanduser("~")
        cache = Path(os.environ.get("CUDA_CACHE_PATH") or os.path.join(home, ".nv", "ComputeCache"))
        compiled = cache / "fake-jit-sm86.bin"
        if os.environ.get("CUDA_CACHE_DISABLE") == "1" or not compiled.exists():
            time.sleep(float(os.environ.get("MSGPU_FAKE_JIT_S", "1")))
            if os.environ.get("CUDA_CACHE_DISABLE") != "1":
                cache.mkdir(parents=True, exist_ok=True)
                compiled.write_bytes(b"sass")

    def fail_without_gpu():
        os.write(2, GLOG_NO_GPU.encode())
        raise RuntimeError(INIT_DEVICE_ERROR)

    def fail_on_this_gpu():
        if mode == "nokernel":
            os.write(2, GLOG_NO_KERNEL_IMAGE.encode())
            raise RuntimeError(NO_KERNEL_IMAGE_ERROR)
        raise RuntimeError(CUDNN_ARCH_ERROR)

    class Mul:
        def __call__(self, x, y):
            if mode == "nogpu" and state["device"] == "GPU":
                fail_without_gpu()
            if mode in ("nokernel", "cudnnarch") and state["device"] == "GPU":
                fail_on_this_gpu()
            if mode == "jit" and state["device"] == "GPU":
                jit_once()
            product = [a * b for a, b in zip(x.values, y.values)]
            if mode == "wrong":
                product[-1] += 1.0
            return Tensor(product)

    def run_check():
        values = {"ms.__version__": release, "ms.get_context('device_target')": state["device"]}
        print(render(texts["prints"][0], values))
        try:
            Mul()(Tensor([1.0, 2.0, 3.0]), Tensor([4.0, 5.0, 6.0]))
            print(render(texts["success"], values))
        except Exception as exc:
            for text in texts["failure"]:
                print(render(text, {**values, "str(e)": str(exc)}))
        sys.stdout.flush()

    if mode == "noplugin":
        os.write(2, GLOG_NO_PLUGIN.encode())
    namespace["__version__"] = release
    namespace["float32"] = "float32"
    namespace["Tensor"] = Tensor
    namespace["run_check"] = run_check
    namespace["context"] = types.SimpleNamespace(
        set_context=set_context, GRAPH_MODE=0, PYNATIVE_MODE=1, get_context=get_context
    )
    if two:  # 2.x also has them at the top level (1.5 does not: tests/unit/data/run_check_texts.json)
        namespace.update(set_context=set_context, get_context=get_context, GRAPH_MODE=0, PYNATIVE_MODE=1)
    namespace["ops"] = types.SimpleNamespace(Mul=Mul)
    if mode == "exit_hang":
        # Like MindSpore 1.5's worker threads: a non-daemon thread that never ends blocks interpreter exit.
        threading.Thread(target=threading.Event().wait, name="never-ends", daemon=False).start()
