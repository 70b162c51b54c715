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

HEADERS = ["cudnn.h", "cudnn_version.h"]


def cudnn_version_code(version: str) -> int:
    """CUDNN_VERSION as cudnn_version.h defines it (8500 for 8.5.0; major*10000 from cuDNN 9 on)."""
    major, minor, patch = (int(part) for part in ([*version.split("."), "0", "0"])[:3])
    return major * (10000 if major >= 9 else 1000) + minor * 100 + patch


@pytest.fixture(scope="module")
def host_vars(host) -> dict:
    return host.ansible.get_variables() if host.backend.NAME == "ansible" else {}


@pytest.fixture(scope="module")
def prefix(host_vars, settings, stack) -> str:
    root = settings.get("install_prefix") or "/usr/local"
    return str(host_vars.get("cudnn_cuda_prefix") or f"{root}/cuda-{stack['cuda']['version']}")


@pytest.fixture(scope="module")
def major(stack) -> str:
    return str(stack["cudnn"]["major"])


@pytest.fixture(scope="module")
def recorded(host, prefix) -> list[str]:
    manifest = host.file(f"{prefix}/.msgpu-cudnn.files")
    assert manifest.is_file, f"{manifest.path} missing: the cudnn role has not completed here"
    return [line for line in manifest.content_string.splitlines() if line.strip()]


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
    lib64 = f"{prefix}/lib64"
    assert host.file(f"{lib64}/libcudnn.so").is_symlink
    assert host.check_output(f"readlink {shlex.quote(lib64 + '/libcudnn.so')}") == f"libcudnn.so.{major}"
    assert host.file(f"{lib64}/libcudnn.so.{major}").is_symlink
    real = host.check_output(f"readlink {shlex.quote(f'{lib64}/libcudnn.so.{major}')}")
    assert re.fullmatch(rf"libcudnn\.so\.{major}\.\d+\.\d+", real), real
    real_file = host.file(f"{lib64}/{real}")
    assert real_file.is_file and not real_file.is_symlink


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
    marker = host.file(f"{prefix}/.msgpu-cudnn")
    assert marker.is_file
    checksum = marker.content_string.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", checksum)
    pinned = stack["cudnn"]["artifact"].get("sha256")
    if pinned:
        assert checksum == pinned


def test_recorded_files_are_root_owned_and_not_world_writable(host, prefix, recorded):
    assert any(name.startswith("include/") for name in recorded)
    assert any(name.startswith("lib64/libcudnn.so") for name in recorded)
    paths = " ".join(shlex.quote(f"{prefix}/{name}") for name in recorded)
    listing = host.check_output(f"stat -c '%U:%G %a %F %n' -- {paths}").splitlines()
    assert len(listing) == len(recorded)
    offenders = [
        line for line in listing
        if not line.startswith("root:root ") or ("symbolic link" not in line and int(line.split()[1], 8) & 0o002)
    ]
    assert not offenders


def test_prefix_is_not_in_the_linker_configuration(host, prefix):
    """The env scripts put the prefix on the library path; the role must not touch ld.so.conf."""
    cmd = host.run(f"grep -rsF -- {shlex.quote(prefix)} /etc/ld.so.conf /etc/ld.so.conf.d")
    assert cmd.rc == 1, cmd.stdout
