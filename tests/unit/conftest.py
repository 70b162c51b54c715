"""Fixtures shared by the unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

STUBS = Path(__file__).resolve().parent / "stub_cuda"


# A GPU as the stubs take it (name:compute capability:MiB), and every variable the stubs and the probe read:
# tests that drive the stubs clear them all first (tests/unit/test_gpu_probe.py, test_verify_doctor.py).
STUB_RTX3090 = "NVIDIA GeForce RTX 3090:8.6:24268"
STUB_VARIABLES = [
    "STUB_CUDA_INIT_RESULT",
    "STUB_CUDA_INIT_ACTION",
    "STUB_CUDA_COUNT_RESULT",
    "STUB_CUDA_DEVICES",
    "STUB_CUDA_DRIVER_VERSION",
    "STUB_CUDA_KERNEL",
    "STUB_CUDA_BAD_DEVICE",
    "STUB_NVML_INIT_RESULT",
    "STUB_NVML_DRIVER",
    "STUB_NVML_PERSISTENCE",
    "STUB_NVML_ECC",
    "MSGPU_LIBCUDA",
    "MSGPU_LIBNVML",
    "CUDA_VISIBLE_DEVICES",
]


@pytest.fixture(scope="session")
def stub_cuda(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The stand-in libcuda and libnvidia-ml (tests/unit/stub_cuda), built once per run with the machine's C
    compiler: `cuda`, `nvml`, and `nvml_minimal` (an NVML without the ECC/PCI calls, like an old driver)."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert compiler, "no C compiler (cc, gcc or clang): install gcc to build the stand-in libcuda/libnvidia-ml"
    out = tmp_path_factory.mktemp("stub_cuda")
    built = {}
    for key, source, flags in (
        ("cuda", "libcuda_stub.c", []),
        ("nvml", "libnvml_stub.c", []),
        ("nvml_minimal", "libnvml_stub.c", ["-DSTUB_NVML_MINIMAL"]),
    ):
        target = out / f"{key}.so"
        command = [compiler, "-shared", "-fPIC", "-Wall", "-Werror", *flags, "-o", str(target), str(STUBS / source)]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
        built[key] = str(target)
    return built


# The GPUs a stand-in NVML/libcuda reports (name:CC:MiB) and a stack's GPU code as the preflight publishes it
# (stack_resolved.gpu_code), for the judge's and the doctor's compute-capability tests.
H100 = "NVIDIA H100 80GB HBM3:9.0:81559"
RTX4090 = "NVIDIA GeForce RTX 4090:8.9:24564"
K80 = "Tesla K80:3.7:11441"
# As the preflight publishes them: MindSpore 1.5.1's GPU library carries PTX 5.3 only; cuDNN 8.0.5's cited range.
GPU_CODE = [
    {
        "name": "MindSpore",
        "version": "1.5.1",
        "code": {"libraries": {"mindspore/lib/libmindspore_gpu.so": {"sass": [], "ptx": ["5.3"]}}},
    },
    {
        "name": "cuDNN",
        "version": "8.0.5",
        "code": {"min": "3.5", "max": "8.6", "above_max": "same_major", "source": "NVIDIA cuDNN 8.0.5 support matrix"},
    },
]
