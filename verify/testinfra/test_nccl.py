"""NCCL in the stack's CUDA prefix: headers, the library's symlink chain, and ncclGetVersion() on the host.

The prefix and the expected version follow the host's inventory (nccl_cuda_prefix,
nccl_expected_version) where it sets them, else the catalog's stack. ncclGetVersion() needs no GPU
and no other CUDA library.
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

HEADERS = ["nccl.h"]


def nccl_version_code(version: str) -> int:
    """NCCL_VERSION_CODE as nccl.h computes it: 2804 for 2.8.4, 21403 for 2.14.3."""
    major, minor, patch = (int(part) for part in ([*version.split("."), "0", "0"])[:3])
    return major * (1000 if major <= 2 and minor <= 8 else 10000) + minor * 100 + patch


@pytest.fixture(scope="module")
def prefix(host_vars, settings, stack) -> str:
    root = settings.get("install_prefix") or "/usr/local"
    return str(host_vars.get("nccl_cuda_prefix") or f"{root}/cuda-{stack['cuda']['version']}")


@pytest.fixture(scope="module")
def major(stack) -> str:
    return str(stack["nccl"]["version"]).split(".")[0]


@pytest.fixture(scope="module")
def recorded(host, prefix) -> list[str]:
    return recorded_files(host, prefix, "nccl")


@pytest.mark.parametrize("header", HEADERS)
def test_header_is_installed(host, prefix, header):
    header_file = host.file(f"{prefix}/include/{header}")
    assert header_file.is_file
    assert header_file.user == "root"
    assert not header_file.mode & 0o002


def test_header_has_the_stack_major(host, prefix, major):
    text = host.file(f"{prefix}/include/nccl.h").content_string
    assert re.search(rf"^#define NCCL_MAJOR {major}$", text, re.MULTILINE)


def test_library_symlink_chain(host, prefix, major):
    """libnccl.so -> libnccl.so.<major> -> libnccl.so.<major>.<minor>.<patch>, as in NVIDIA's tarballs."""
    assert_symlink_chain(host, f"{prefix}/lib64", "libnccl", major)


def test_library_reports_expected_version(host, prefix, major, host_vars, stack):
    expected = int(host_vars.get("nccl_expected_version") or nccl_version_code(stack["nccl"]["version"]))
    library = f"{prefix}/lib64/libnccl.so.{major}"
    code = (
        f"import ctypes; lib = ctypes.CDLL({library!r}); version = ctypes.c_int(); "
        "assert lib.ncclGetVersion(ctypes.byref(version)) == 0; print(version.value)"
    )
    cmd = host.run(f"LD_LIBRARY_PATH={shlex.quote(prefix + '/lib64')} python3 -c {shlex.quote(code)}")
    assert cmd.rc == 0, cmd.stderr
    assert int(cmd.stdout.strip()) == expected


def test_marker_holds_the_artifact_checksum(host, prefix, stack):
    assert_marker(host, prefix, "nccl", stack["nccl"]["artifact"].get("sha256"))


def test_recorded_files_are_root_owned_and_not_world_writable(host, prefix, recorded):
    assert_root_owned(host, prefix, recorded, "libnccl")


def test_prefix_is_not_in_the_linker_configuration(host, prefix):
    assert_not_in_linker_configuration(host, prefix)
