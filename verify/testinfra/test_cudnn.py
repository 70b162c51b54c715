"""cuDNN in the stack's CUDA prefix: headers, the library's symlink chain, and cudnnGetVersion() on the host.

The prefix and the expected version follow the host's inventory (cudnn_cuda_prefix,
cudnn_expected_version) where it sets them, else the catalog's stack. cudnnGetVersion() needs no
GPU, but cuDNN 8 loads its sub-libraries on the first call, and those need cuBLAS (CUDA toolkit,
in the prefix) and libcuda.so.1 (driver): the check runs with the prefix on LD_LIBRARY_PATH, as
the env scripts set it.
"""

from __future__ import annotations

import re
import shlex

import pytest
from prefix_libraries import (
    assert_marker,
    assert_not_in_linker_configuration,
    assert_root_owned,
    assert_symlink_chain,
    recorded_files,
)

HEADERS = ["cudnn.h", "cudnn_version.h"]


def cudnn_version_code(version: str) -> int:
    """CUDNN_VERSION as cudnn_version.h defines it (8500 for 8.5.0; major*10000 from cuDNN 9 on)."""
    major, minor, patch = (int(part) for part in ([*version.split("."), "0", "0"])[:3])
    return major * (10000 if major >= 9 else 1000) + minor * 100 + patch


@pytest.fixture(scope="module")
def prefix(host_vars, settings, stack) -> str:
    root = settings.get("install_prefix") or "/usr/local"
    return str(host_vars.get("cudnn_cuda_prefix") or f"{root}/cuda-{stack['cuda']['version']}")


@pytest.fixture(scope="module")
def major(stack) -> str:
    return str(stack["cudnn"]["major"])


@pytest.fixture(scope="module")
def recorded(host, prefix) -> list[str]:
    return recorded_files(host, prefix, "cudnn")


@pytest.mark.parametrize("header", HEADERS)
def test_header_is_installed(host, prefix, header):
    header_file = host.file(f"{prefix}/include/{header}")
    assert header_file.is_file
    assert header_file.user == "root"
    assert not header_file.mode & 0o002


def test_version_header_has_the_stack_major(host, prefix, major):
    text = host.file(f"{prefix}/include/cudnn_version.h").content_string
    assert re.search(rf"^#define CUDNN_MAJOR {major}$", text, re.MULTILINE)


def test_library_symlink_chain(host, prefix, major):
    """libcudnn.so -> libcudnn.so.<major> -> libcudnn.so.<major>.<minor>.<patch>, as in NVIDIA's tarballs."""
    assert_symlink_chain(host, f"{prefix}/lib64", "libcudnn", major)


def test_library_reports_expected_version(host, prefix, major, host_vars, stack):
    expected = int(host_vars.get("cudnn_expected_version") or cudnn_version_code(stack["cudnn"]["version"]))
    library = f"{prefix}/lib64/libcudnn.so.{major}"
    code = (
        f"import ctypes; lib = ctypes.CDLL({library!r}); lib.cudnnGetVersion.restype = ctypes.c_size_t; "
        "print(lib.cudnnGetVersion())"
    )
    cmd = host.run(f"LD_LIBRARY_PATH={shlex.quote(prefix + '/lib64')} python3 -c {shlex.quote(code)}")
    assert cmd.rc == 0, cmd.stderr
    assert int(cmd.stdout.strip()) == expected


def test_marker_holds_the_artifact_checksum(host, prefix, stack):
    assert_marker(host, prefix, "cudnn", stack["cudnn"]["artifact"].get("sha256"))


def test_recorded_files_are_root_owned_and_not_world_writable(host, prefix, recorded):
    assert_root_owned(host, prefix, recorded, "libcudnn")


def test_prefix_is_not_in_the_linker_configuration(host, prefix):
    assert_not_in_linker_configuration(host, prefix)
