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
