"""A GPU probe without a framework: the CUDA driver (libcuda) and NVML (libnvidia-ml) through ctypes.

Standard library only, Python 3.8 to 3.12, no relative imports: the file can be copied alone to any machine
that has the NVIDIA driver and run as ``python gpu_probe.py [--pretty]``. It answers "does the driver see
the GPUs, and does a kernel run on each of them?" before any framework is involved, so a failure here is
the driver's or the machine's, never MindSpore's.

For every device: name, memory, compute capability, a context (timed: the first one pays the driver's
start-up), a tiny PTX kernel JIT-compiled by the driver (sm_50, PTX 6.0: any driver >= 410 builds it for its
own GPUs), launched on 256 threads and its result checked on the host. NVML adds the driver version,
persistence mode and ECC state; it is informational and never changes the verdict.

Verdicts and exit codes (0 and 1 stay free for "ok" and Python's own crash, 2 is argparse's):
  OK 0, NO_DRIVER 3, NO_DEVICE 4, DRIVER_ERROR 5, KERNEL_FAILED 6.

Tested against stand-in C libraries (tests/unit/stub_cuda) and the real libcuda of Ubuntu's
libnvidia-compute-470 on a machine without a GPU (cuInit answers 100); never run on a real GPU here.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

VERDICTS = ("OK", "NO_DRIVER", "NO_DEVICE", "DRIVER_ERROR", "KERNEL_FAILED")
EXIT_CODES = {"OK": 0, "NO_DRIVER": 3, "NO_DEVICE": 4, "DRIVER_ERROR": 5, "KERNEL_FAILED": 6}
DEFAULT_LIBCUDA = "libcuda.so.1"
DEFAULT_LIBNVML = "libnvidia-ml.so.1"

CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100
NVML_ERROR_NOT_SUPPORTED = 3
ATTR_CC_MAJOR = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
ATTR_CC_MINOR = 76
# Names for when the library has no cuGetErrorName (or is not libcuda at all).
CUDA_ERRORS = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    46: "CUDA_ERROR_DEVICES_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    218: "CUDA_ERROR_INVALID_PTX",
    500: "CUDA_ERROR_NOT_FOUND",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}

THREADS = 256
KERNEL_NAME = b"msgpu_mul"
# out[i] = a[i] * b[i] for i < n (unsigned 32-bit). Checked with ptxas 13.0 for sm_75 and sm_90.
PTX = b"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry msgpu_mul(
    .param .u64 msgpu_mul_out,
    .param .u64 msgpu_mul_a,
    .param .u64 msgpu_mul_b,
    .param .u32 msgpu_mul_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<9>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [msgpu_mul_out];
    ld.param.u64 %rd2, [msgpu_mul_a];
    ld.param.u64 %rd3, [msgpu_mul_b];
    ld.param.u32 %r1, [msgpu_mul_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.u32 %rd7, %r5, 4;
    add.s64 %rd8, %rd5, %rd7;
    ld.global.u32 %r6, [%rd8];
    add.s64 %rd9, %rd6, %rd7;
    ld.global.u32 %r7, [%rd9];
    mul.lo.s32 %r8, %r6, %r7;
    add.s64 %rd10, %rd4, %rd7;
    st.global.u32 [%rd10], %r8;
DONE:
    ret;
}
"""

VOIDP, INT, UINT, U64, SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_size_t
VOIDPP = ctypes.POINTER(ctypes.c_void_p)
INTP, UINTP = ctypes.POINTER(INT), ctypes.POINTER(UINT)
# Signatures (64-bit, the _v2 ABI: CUdeviceptr is 64 bits). Every function returns CUresult / nvmlReturn_t.
CUDA_REQUIRED = {
    "cuInit": [UINT],
    "cuDeviceGetCount": [INTP],
    "cuDeviceGet": [INTP, INT],
    "cuDeviceGetName": [ctypes.c_char_p, INT, INT],
    "cuDeviceTotalMem_v2": [ctypes.POINTER(SZ), INT],
    "cuDeviceGetAttribute": [INTP, INT, INT],
    "cuCtxCreate_v2": [VOIDPP, UINT, INT],
    "cuCtxDestroy_v2": [VOIDP],
    "cuCtxSynchronize": [],
    "cuModuleLoadData": [VOIDPP, ctypes.c_char_p],
    "cuModuleGetFunction": [VOIDPP, VOIDP, ctypes.c_char_p],
    "cuMemAlloc_v2": [ctypes.POINTER(U64), SZ],
    "cuMemFree_v2": [U64],
    "cuMemcpyHtoD_v2": [U64, VOIDP, SZ],
    "cuMemcpyDtoH_v2": [VOIDP, U64, SZ],
    "cuLaunchKernel": [VOIDP, UINT, UINT, UINT, UINT, UINT, UINT, UINT, VOIDP, VOIDPP, VOIDPP],
}
CUDA_OPTIONAL = {"cuGetErrorName": [INT, ctypes.POINTER(ctypes.c_char_p)], "cuDriverGetVersion": [INTP]}
NVML_REQUIRED = {"nvmlInit_v2": [], "nvmlShutdown": []}
NVML_OPTIONAL = {
    "nvmlErrorString": [INT],
    "nvmlSystemGetDriverVersion": [ctypes.c_char_p, UINT],
    "nvmlDeviceGetCount_v2": [UINTP],
    "nvmlDeviceGetHandleByIndex_v2": [UINT, VOIDPP],
    "nvmlDeviceGetName": [VOIDP, ctypes.c_char_p, UINT],
    "nvmlDeviceGetPersistenceMode": [VOIDP, INTP],
    "nvmlDeviceGetEccMode": [VOIDP, INTP, INTP],
    "nvmlDeviceGetPciInfo_v3": [VOIDP, VOIDP],
}


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it; ``reserved`` is slack in case a driver writes more."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", UINT),
        ("bus", UINT),
        ("device", UINT),
        ("pciDeviceId", UINT),
        ("pciSubSystemId", UINT),
        ("busId", ctypes.c_char * 32),
        ("reserved", ctypes.c_char * 64),
    ]


class Library:
    """A loaded library and the functions found in it; a missing symbol is recorded, never raised."""

    def __init__(self, path: str, required: Dict[str, list], optional: Dict[str, list]) -> None:
        self.path = path
        self.handle = ctypes.CDLL(path)  # OSError when it cannot be loaded: the caller's verdict
        self.functions: Dict[str, Any] = {}
        self.missing: List[str] = []
        self.missing_required: List[str] = []
        for table, required_table in ((required, True), (optional, False)):
            for name, argtypes in table.items():
                try:
                    function = getattr(self.handle, name)
                except AttributeError:
                    self.missing.append(name)
                    if required_table:
                        self.missing_required.append(name)
                    continue
                function.argtypes = argtypes
                function.restype = ctypes.c_char_p if name == "nvmlErrorString" else INT
                self.functions[name] = function

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["functions"][name]
        except KeyError:
            raise AttributeError(name) from None

    def has(self, name: str) -> bool:
        return name in self.functions


class CudaError(Exception):
    def __init__(self, step: str, code: int, name: str) -> None:
        super().__init__(f"{step} returned {name} ({code})")
        self.step, self.code, self.name = step, code, name


def cuda_error_name(cuda: Library, code: int) -> str:
    if cuda.has("cuGetErrorName"):
        text = ctypes.c_char_p()
        if cuda.cuGetErrorName(code, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
            return text.value.decode(errors="replace")
    return CUDA_ERRORS.get(code, f"CUresult {code}")


def check(cuda: Library, step: str, code: int) -> None:
    if code != CUDA_SUCCESS:
        raise CudaError(step, code, cuda_error_name(cuda, code))


def run_kernel(cuda: Library, device: Dict[str, Any]) -> None:
    """Context, module, three buffers, launch, check on the host; fills ``device`` as far as it gets."""
    ctx = ctypes.c_void_p()
    buffers: List[ctypes.c_uint64] = []
    words = ctypes.c_uint32 * THREADS
    a = words(*[i + 1 for i in range(THREADS)])
    b = words(*[2 * i + 3 for i in range(THREADS)])
    out = words()
    try:
        start = time.perf_counter()
        check(cuda, "cuCtxCreate_v2", cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, device["handle"]))
        device["context_seconds"] = round(time.perf_counter() - start, 6)
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        start = time.perf_counter()
        check(cuda, "cuModuleLoadData", cuda.cuModuleLoadData(ctypes.byref(module), PTX))
        device["module_seconds"] = round(time.perf_counter() - start, 6)
        check(cuda, "cuModuleGetFunction", cuda.cuModuleGetFunction(ctypes.byref(function), module, KERNEL_NAME))
        for _ in range(3):
            pointer = ctypes.c_uint64()
            check(cuda, "cuMemAlloc_v2", cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.sizeof(out)))
            buffers.append(pointer)
        d_out, d_a, d_b = buffers
        for dest, src in ((d_a, a), (d_b, b)):
            check(cuda, "cuMemcpyHtoD_v2", cuda.cuMemcpyHtoD_v2(dest, ctypes.byref(src), ctypes.sizeof(src)))
        n = ctypes.c_uint32(THREADS)
        params = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in (d_out, d_a, d_b, n)])
        start = time.perf_counter()
        check(cuda, "cuLaunchKernel", cuda.cuLaunchKernel(function, 1, 1, 1, THREADS, 1, 1, 0, None, params, None))
        check(cuda, "cuCtxSynchronize", cuda.cuCtxSynchronize())
        seconds = round(time.perf_counter() - start, 6)
        check(cuda, "cuMemcpyDtoH_v2", cuda.cuMemcpyDtoH_v2(ctypes.byref(out), d_out, ctypes.sizeof(out)))
        wrong = [i for i in range(THREADS) if out[i] != (a[i] * b[i]) & 0xFFFFFFFF]
        device["kernel"] = {"ok": not wrong, "seconds": seconds, "threads": THREADS}
        if wrong:
            i = wrong[0]
            device["kernel"].update(
                step="result",
                error=f"{len(wrong)} of {THREADS} results wrong, first out[{i}] = {out[i]}, expected {a[i] * b[i]}",
            )
    except CudaError as exc:
        device["kernel"] = {"ok": False, "step": exc.step, "error": f"{exc.name} ({exc.code})"}
    finally:
        for pointer in buffers:
            cuda.cuMemFree_v2(pointer)
        if ctx.value:
            cuda.cuCtxDestroy_v2(ctx)


def probe_device(cuda: Library, index: int) -> Dict[str, Any]:
    device: Dict[str, Any] = {"index": index}
    handle, value, name, memory = ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(256), ctypes.c_size_t()
    try:
        check(cuda, "cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(handle), index))
        device["handle"] = handle.value
        check(cuda, "cuDeviceGetName", cuda.cuDeviceGetName(name, len(name), handle))
        device["name"] = name.value.decode(errors="replace")
        check(cuda, "cuDeviceTotalMem_v2", cuda.cuDeviceTotalMem_v2(ctypes.byref(memory), handle))
        device["total_memory_mib"] = memory.value // (1024 * 1024)
        capability = []
        for attribute in (ATTR_CC_MAJOR, ATTR_CC_MINOR):
            check(cuda, "cuDeviceGetAttribute", cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, handle))
            capability.append(str(value.value))
        device["compute_capability"] = ".".join(capability)
    except CudaError as exc:
        device["kernel"] = {"ok": False, "step": exc.step, "error": f"{exc.name} ({exc.code})"}
        return device
    run_kernel(cuda, device)
    return device


def probe_nvml(path: str) -> Dict[str, Any]:
    """Driver version, persistence mode and ECC per device; NVML's absence is an answer, not an error."""
    try:
        nvml = Library(path, NVML_REQUIRED, NVML_OPTIONAL)
    except OSError as exc:
        return {"available": False, "library": path, "reason": f"cannot load {path}: {exc}"}
    doc: Dict[str, Any] = {"library": path, "missing_symbols": nvml.missing}
    if nvml.missing_required:
        return dict(doc, available=False, reason=f"{path} lacks {', '.join(nvml.missing_required)}")

    def text(code: int) -> str:
        message = nvml.nvmlErrorString(code) if nvml.has("nvmlErrorString") else None
        return f"{message.decode(errors='replace') if message else 'NVML error'} ({code})"

    code = nvml.nvmlInit_v2()
    if code != 0:
        return dict(doc, available=False, reason=f"nvmlInit_v2: {text(code)}")
    try:
        doc.update(available=True, driver_version=None, devices=[])
        buffer = ctypes.create_string_buffer(96)
        if nvml.has("nvmlSystemGetDriverVersion") and nvml.nvmlSystemGetDriverVersion(buffer, len(buffer)) == 0:
            doc["driver_version"] = buffer.value.decode(errors="replace")
        count = ctypes.c_uint()
        if not nvml.has("nvmlDeviceGetCount_v2") or not nvml.has("nvmlDeviceGetHandleByIndex_v2"):
            return doc
        code = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if code != 0:
            doc["devices_error"] = f"nvmlDeviceGetCount_v2: {text(code)}"
            return doc
        for index in range(count.value):
            doc["devices"].append(nvml_device(nvml, index, text))
        return doc
    finally:
        nvml.nvmlShutdown()


def nvml_device(nvml: Library, index: int, text: Any) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"index": index}
    handle = ctypes.c_void_p()
    code = nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
    if code != 0:
        entry["error"] = f"nvmlDeviceGetHandleByIndex_v2: {text(code)}"
        return entry
    name, mode, pending, pci = ctypes.create_string_buffer(96), ctypes.c_int(), ctypes.c_int(), PciInfo()
    if nvml.has("nvmlDeviceGetName") and nvml.nvmlDeviceGetName(handle, name, len(name)) == 0:
        entry["name"] = name.value.decode(errors="replace")
    if nvml.has("nvmlDeviceGetPciInfo_v3") and nvml.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)) == 0:
        entry["pci_bus_id"] = pci.busId.decode(errors="replace")
    for key, symbol, args in (
        ("persistence_mode", "nvmlDeviceGetPersistenceMode", (ctypes.byref(mode),)),
        ("ecc", "nvmlDeviceGetEccMode", (ctypes.byref(mode), ctypes.byref(pending))),
    ):
        if not nvml.has(symbol):
            entry[key] = f"unknown ({symbol} missing)"
            continue
        code = getattr(nvml, symbol)(handle, *args)
        if code == 0:
            entry[key] = "on" if mode.value else "off"
        elif code == NVML_ERROR_NOT_SUPPORTED:  # GeForce cards have no ECC: a normal answer
            entry[key] = "not supported"
        else:
            entry[key] = f"unknown ({symbol}: {text(code)})"
    return entry


def probe(libcuda: Optional[str] = None, libnvml: Optional[str] = None) -> Dict[str, Any]:
    """The whole probe; returns the JSON document (``verdict``, ``reason``, ``devices``, ``nvml``, ...)."""
    cuda_path = libcuda or os.environ.get("MSGPU_LIBCUDA") or DEFAULT_LIBCUDA
    nvml_path = libnvml or os.environ.get("MSGPU_LIBNVML") or DEFAULT_LIBNVML
    doc: Dict[str, Any] = {"libcuda": cuda_path, "devices": [], "cuda_driver_version": None}
    doc["nvml"] = probe_nvml(nvml_path)
    try:
        cuda = Library(cuda_path, CUDA_REQUIRED, CUDA_OPTIONAL)
    except OSError as exc:
        return verdict(doc, "NO_DRIVER", f"the CUDA driver library cannot be loaded: {exc}")
    doc["missing_symbols"] = cuda.missing
    if cuda.missing_required:
        return verdict(
            doc, "DRIVER_ERROR", f"{cuda_path} is not a usable libcuda: it lacks " + ", ".join(cuda.missing_required)
        )
    version = ctypes.c_int()
    if cuda.has("cuDriverGetVersion") and cuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
        doc["cuda_driver_version"] = f"{version.value // 1000}.{(version.value % 1000) // 10}"
    count = ctypes.c_int()
    failure = driver_failure(cuda, doc, "cuInit", cuda.cuInit(0)) or driver_failure(
        cuda, doc, "cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(count))
    )
    if failure:
        return failure
    doc["device_count"] = count.value
    if count.value == 0:
        return verdict(doc, "NO_DEVICE", "cuDeviceGetCount says 0 devices: the driver sees no GPU")
    for index in range(count.value):
        device = probe_device(cuda, index)
        device.pop("handle", None)
        doc["devices"].append(device)
    failed = [d for d in doc["devices"] if not d.get("kernel", {}).get("ok")]
    if failed:
        reasons = "; ".join(
            "device {} ({}): {} {}".format(d["index"], d.get("name", "?"), d["kernel"]["step"], d["kernel"]["error"])
            for d in failed
        )
        return verdict(doc, "KERNEL_FAILED", f"{len(failed)} of {count.value} devices failed the kernel: {reasons}")
    return verdict(doc, "OK", f"all {count.value} devices ran the kernel and its result is right")


def driver_failure(cuda: Library, doc: Dict[str, Any], step: str, code: int) -> Optional[Dict[str, Any]]:
    """Records cuInit's / cuDeviceGetCount's answer; the finished document when it ends the probe."""
    name = cuda_error_name(cuda, code) if code else "CUDA_SUCCESS"
    doc[f"{step}_result"] = {"code": code, "name": name}
    if code == CUDA_ERROR_NO_DEVICE:
        return verdict(doc, "NO_DEVICE", f"{step} says {name} ({code}): the driver sees no GPU")
    if code != CUDA_SUCCESS:
        return verdict(doc, "DRIVER_ERROR", f"{step} failed with {name} ({code})")
    return None


def verdict(doc: Dict[str, Any], word: str, reason: str) -> Dict[str, Any]:
    doc["verdict"], doc["reason"] = word, reason
    return doc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--libcuda", help=f"libcuda to load (default: $MSGPU_LIBCUDA or {DEFAULT_LIBCUDA})")
    parser.add_argument("--libnvml", help=f"libnvidia-ml to load (default: $MSGPU_LIBNVML or {DEFAULT_LIBNVML})")
    parser.add_argument("--pretty", action="store_true", help="indented JSON")


def run(args: argparse.Namespace) -> int:
    document = probe(args.libcuda, args.libnvml)
    print(json.dumps(document, indent=2 if args.pretty else None, sort_keys=True))
    return EXIT_CODES[document["verdict"]]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_probe", description="GPU probe: libcuda + NVML through ctypes")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
