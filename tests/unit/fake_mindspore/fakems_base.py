"""A tiny stand-in for the parts of MindSpore the judge's probe touches, in several broken ways.

Each variant's ``mindspore/__init__.py`` calls ``install(globals(), "<mode>")``. Modes: ok, wrong,
nogpu, exit_hang. (hang and missing_lib break at import time in their own __init__.)
"""

from __future__ import annotations

import os
import sys
import threading
import types

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


def install(namespace: dict, mode: str) -> None:
    state = {"device": "GPU"}

    def set_context(**kwargs):
        state["device"] = kwargs.get("device_target", state["device"])

    def fail_without_gpu():
        os.write(2, GLOG_NO_GPU.encode())
        raise RuntimeError(INIT_DEVICE_ERROR)

    class Mul:
        def __call__(self, x, y):
            if mode == "nogpu" and state["device"] == "GPU":
                fail_without_gpu()
            product = [a * b for a, b in zip(x.values, y.values)]
            if mode == "wrong":
                product[-1] += 1.0
            return Tensor(product)

    def run_check():
        print("MindSpore version: ", namespace["__version__"])
        try:
            Mul()(Tensor([1.0, 2.0, 3.0]), Tensor([4.0, 5.0, 6.0]))
            print(
                "The result of multiplication calculation is correct, MindSpore has been installed successfully!"
            )
        except Exception as exc:
            print("MindSpore running check failed.")
            print(str(exc))
        sys.stdout.flush()

    namespace["__version__"] = "1.5.1"
    namespace["float32"] = "float32"
    namespace["Tensor"] = Tensor
    namespace["run_check"] = run_check
    namespace["context"] = types.SimpleNamespace(
        set_context=set_context, GRAPH_MODE=0, PYNATIVE_MODE=1, get_context=lambda key: state.get(key)
    )
    namespace["ops"] = types.SimpleNamespace(Mul=Mul)
    if mode == "exit_hang":
        # Like MindSpore 1.5's worker threads: a non-daemon thread that never ends blocks interpreter exit.
        threading.Thread(target=threading.Event().wait, name="never-ends", daemon=False).start()
