"""cuDNN and NCCL in the stack's CUDA prefix (role cuda_library): headers, the library's symlink
chain, the version the loaded library reports, and what the role recorded.

Each library's role run records its files in <prefix>/.msgpu-<name>.files and writes
<prefix>/.msgpu-<name> (the artifact's sha256) last. The prefix and the expected version follow
the host's inventory (<name>_cuda_prefix, <name>_expected_version) where it sets them, else the
catalog's stack. cudnnGetVersion() needs no GPU, but cuDNN 8 loads its sub-libraries on the first
call, and those need cuBLAS (CUDA toolkit, in the prefix) and libcuda.so.1 (driver): the check runs
with the prefix on LD_LIBRARY_PATH, as the env scripts set it.

With the cuda_repo method (stack_<name>_method) the library comes from NVIDIA's deb packages
instead: headers in /usr/include, libraries in /usr/lib/x86_64-linux-gnu, and dpkg, not the
role, records the files; the same chain, version and ownership checks apply there.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable

import pytest


def cudnn_version_code(version: str) -> int:
    """CUDNN_VERSION as cudnn_version.h defines it (8500 for 8.5.0; major*10000 from cuDNN 9 on)."""
    major, minor, patch = (int(part) for part in ([*version.split("."), "0", "0"])[:3])
    return major * (10000 if major >= 9 else 1000) + minor * 100 + patch


def nccl_version_code(version: str) -> int:
    """NCCL_VERSION_CODE as nccl.h computes it: 2804 for 2.8.4, 21403 for 2.14.3."""
    major, minor, patch = (int(part) for part in ([*version.split("."), "0", "0"])[:3])
    return major * (1000 if major <= 2 and minor <= 8 else 10000) + minor * 100 + patch


@dataclass(frozen=True)
class Library:
    name: str
    headers: tuple[str, ...]
    major_header: str
    major_macro: str
    soname: str
    version_code: Callable[[str], int]
    # Python that prints the version the loaded library reports (`lib` is the ctypes handle).
    version_call: str


LIBRARIES = {
    "cudnn": Library(
        "cudnn",
        ("cudnn.h", "cudnn_version.h"),
        "cudnn_version.h",
        "CUDNN_MAJOR",
        "libcudnn",
        cudnn_version_code,
        "lib.cudnnGetVersion.restype = ctypes.c_size_t; print(lib.cudnnGetVersion())",
    ),
    "nccl": Library(
        "nccl",
        ("nccl.h",),
        "nccl.h",
        "NCCL_MAJOR",
        "libnccl",
        nccl_version_code,
        "version = ctypes.c_int(); assert lib.ncclGetVersion(ctypes.byref(version)) == 0; print(version.value)",
    ),
}
HEADERS = [(name, header) for name, library in LIBRARIES.items() for header in library.headers]
# Where NVIDIA's deb packages (method cuda_repo) put the files.
REPO_INCLUDE_DIR = "/usr/include"
REPO_LIB_DIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module", params=sorted(LIBRARIES))
def library(request) -> Library:
    return LIBRARIES[request.param]


def prefix_of(name: str, host_vars, settings, stack) -> str:
    root = settings.get("install_prefix") or "/usr/local"
    return str(host_vars.get(f"{name}_cuda_prefix") or f"{root}/cuda-{stack['cuda']['version']}")


@pytest.fixture(scope="module")
def prefix(library, host_vars, settings, stack) -> str:
    return prefix_of(library.name, host_vars, settings, stack)


def from_repo(name: str, stack) -> bool:
    return stack[name]["method"] == "cuda_repo"


@pytest.fixture(scope="module")
def include_dir(library, prefix, stack) -> str:
    return REPO_INCLUDE_DIR if from_repo(library.name, stack) else f"{prefix}/include"


@pytest.fixture(scope="module")
def lib_dir(library, prefix, stack) -> str:
    return REPO_LIB_DIR if from_repo(library.name, stack) else f"{prefix}/lib64"


@pytest.fixture(scope="module")
def major(library, stack) -> str:
    return str(stack[library.name]["version"]).split(".")[0]


@pytest.fixture(scope="module")
def recorded(host, library, prefix, stack) -> list[str]:
    if from_repo(library.name, stack):
        pytest.skip("cuda_repo: dpkg records the packages' files, not the role")
    manifest = host.file(f"{prefix}/.msgpu-{library.name}.files")
    assert manifest.is_file, f"{manifest.path} missing: the cuda_library role has not completed here"
    return [line for line in manifest.content_string.splitlines() if line.strip()]


@pytest.mark.parametrize(("name", "header"), HEADERS)
def test_header_is_installed(host, host_vars, settings, stack, name, header):
    folder = REPO_INCLUDE_DIR if from_repo(name, stack) else f"{prefix_of(name, host_vars, settings, stack)}/include"
    header_file = host.file(f"{folder}/{header}")
    assert header_file.is_file
    assert header_file.user == "root"
    assert not header_file.mode & 0o002


def test_header_has_the_stack_major(host, library, include_dir, major):
    text = host.file(f"{include_dir}/{library.major_header}").content_string
    assert re.search(rf"^#define {library.major_macro} {major}$", text, re.MULTILINE)


def test_library_symlink_chain(host, library, lib_dir, major):
    """lib<x>.so -> lib<x>.so.<major> -> lib<x>.so.<major>.<minor>.<patch>, as in NVIDIA's tarballs and debs."""
    lib64, soname = lib_dir, library.soname
    assert host.file(f"{lib64}/{soname}.so").is_symlink
    assert host.check_output(f"readlink {shlex.quote(f'{lib64}/{soname}.so')}") == f"{soname}.so.{major}"
    assert host.file(f"{lib64}/{soname}.so.{major}").is_symlink
    real = host.check_output(f"readlink {shlex.quote(f'{lib64}/{soname}.so.{major}')}")
    assert re.fullmatch(rf"{re.escape(soname)}\.so\.{major}\.\d+\.\d+", real), real
    real_file = host.file(f"{lib64}/{real}")
    assert real_file.is_file and not real_file.is_symlink


def test_library_reports_expected_version(host, library, prefix, lib_dir, major, host_vars, stack):
    expected = int(
        host_vars.get(f"{library.name}_expected_version") or library.version_code(stack[library.name]["version"])
    )
    path = f"{lib_dir}/{library.soname}.so.{major}"
    code = f"import ctypes; lib = ctypes.CDLL({path!r}); {library.version_call}"
    cmd = host.run(f"LD_LIBRARY_PATH={shlex.quote(prefix + '/lib64')} python3 -c {shlex.quote(code)}")
    assert cmd.rc == 0, cmd.stderr
    assert int(cmd.stdout.strip()) == expected


def test_marker_holds_the_artifact_checksum(host, library, prefix, stack):
    if from_repo(library.name, stack):
        pytest.skip("cuda_repo: dpkg records the packages, the role writes no marker")
    marker = host.file(f"{prefix}/.msgpu-{library.name}")
    assert marker.is_file
    checksum = marker.content_string.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", checksum)
    pinned = stack[library.name]["artifact"].get("sha256")
    if pinned:
        assert checksum == pinned


def test_recorded_files_are_root_owned_and_not_world_writable(host, library, prefix, recorded):
    """Every recorded file is root's and not world-writable (symlinks' own modes do not count)."""
    assert any(name.startswith("include/") for name in recorded)
    assert any(name.startswith(f"lib64/{library.soname}.so") for name in recorded)
    paths = " ".join(shlex.quote(f"{prefix}/{name}") for name in recorded)
    listing = host.check_output(f"stat -c '%U:%G %a %F %n' -- {paths}").splitlines()
    assert len(listing) == len(recorded)
    offenders = [
        line
        for line in listing
        if not line.startswith("root:root ") or ("symbolic link" not in line and int(line.split()[1], 8) & 0o002)
    ]
    assert not offenders


def test_prefix_is_not_in_the_linker_configuration(host, prefix):
    """The env scripts put the prefix on the library path; the role must not touch ld.so.conf."""
    cmd = host.run(f"grep -rsF -- {shlex.quote(prefix)} /etc/ld.so.conf /etc/ld.so.conf.d")
    assert cmd.rc == 1, cmd.stdout


def test_package_files_are_root_owned_and_not_world_writable(host, library, stack, lib_dir, include_dir):
    """cuda_repo: every file of the library's packages is root's and not world-writable."""
    if not from_repo(library.name, stack):
        pytest.skip("only the cuda_repo method installs the library as packages")
    packages = [spec.partition("=")[0] for spec in stack[library.name]["artifact"]["packages"]]
    files = host.check_output(f"dpkg-query --listfiles {' '.join(map(shlex.quote, packages))}").splitlines()
    assert any(f.startswith(f"{lib_dir}/{library.soname}.so") for f in files)
    assert any(f.startswith(f"{include_dir}/") for f in files)
    paths = " ".join(shlex.quote(f) for f in files if f.startswith((lib_dir + "/", include_dir + "/")))
    listing = host.check_output(f"stat -c '%U:%G %a %F %n' -- {paths}").splitlines()
    offenders = [
        line
        for line in listing
        if not line.startswith("root:root ") or ("symbolic link" not in line and int(line.split()[1], 8) & 0o002)
    ]
    assert not offenders


def test_installed_packages_leave_no_copy_in_apts_cache(host, library, stack):
    """cuda_repo: once installed, the library's packages are not kept in /var/cache/apt/archives (cuDNN's
    take about 1 GB there)."""
    if not from_repo(library.name, stack):
        pytest.skip("only the cuda_repo method installs the library as packages")
    for spec in stack[library.name]["artifact"]["packages"]:
        package = spec.partition("=")[0]
        kept = host.run(f"ls /var/cache/apt/archives/{shlex.quote(package)}_*.deb").stdout.split()
        assert not kept, f"{kept}: the installed package is still in apt's cache"
