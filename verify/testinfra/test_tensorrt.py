"""TensorRT (role tensorrt), when the stack enables it: the libraries load and report their version,
the Python binding imports in the MindSpore virtualenv, and the env file is clean.

Paths and the expected version follow the host's inventory (tensorrt_install_root,
tensorrt_expected_version, the mindspore role's user and virtualenv) where it sets them, else the
role's defaults and the catalog's stack. getInferLibVersion() needs no GPU; libnvinfer_plugin needs
cuBLAS and cuDNN, which the env file's LD_LIBRARY_PATH (the stack's CUDA lib64) provides.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

# Loads libnvinfer.so.<major> from the TensorRT library folder the env file selects (TENSORRT_HOME:
# the tarball's prefix with lib/, or the wheel's tensorrt package), then the plugin library, then
# imports the binding; prints what each reports.
PROBE = r"""
import ctypes, glob, json, os, re
home = os.environ["TENSORRT_HOME"]
libdir = os.path.join(home, "lib") if os.path.isdir(os.path.join(home, "lib")) else home
def soname(base):
    return sorted(p for p in glob.glob(os.path.join(libdir, base + ".so.*")) if re.search(r"\.so\.[0-9]+$", p))[-1]
nvinfer = ctypes.CDLL(soname("libnvinfer"))
nvinfer.getInferLibVersion.restype = ctypes.c_int32
ctypes.CDLL(soname("libnvinfer_plugin"))
import tensorrt
print(json.dumps({"version": nvinfer.getInferLibVersion(), "python": tensorrt.__version__,
                  "python_file": tensorrt.__file__, "libdir": libdir}))
"""
METADATA = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


def _setting(host_vars: dict, name: str, default: str) -> str:
    """A role variable as the inventory sets it (the role's default otherwise)."""
    value = host_vars.get(name)
    return str(value) if value not in (None, "") and "{{" not in str(value) else default


def version_code(version: str) -> int:
    """NV_TENSORRT_VERSION: major*1000 + minor*100 + patch (7202 for 7.2.2.3, 8401 for 8.4.1.5)."""
    major, minor, patch = (int(part) for part in [*str(version).split("."), "0", "0"][:3])
    return major * 1000 + minor * 100 + patch


def tarball_sha256(artifact: dict) -> str:
    """The sha256 the role installs the tarball by (its install marker's content)."""
    if artifact.get("sha256"):
        return artifact["sha256"]
    local = Path(artifact.get("local_path") or "")
    if artifact.get("local_path") and local.is_file():
        with local.open("rb") as tarball:
            return hashlib.file_digest(tarball, "sha256").hexdigest()
    pytest.fail(
        f"no sha256 for {artifact['file']}: this host's settings pin none (stack_artifact_checksums) and give "
        "no copy on the controller (stack_local_artifacts), so the role cannot have installed it"
    )


@pytest.fixture(scope="module")
def tensorrt(stack) -> dict:
    if not stack["tensorrt"].get("enabled"):
        pytest.skip("TensorRT is not enabled for this host (stack_tensorrt_enabled: false)")
    return stack["tensorrt"]


@pytest.fixture(scope="module")
def user(host_vars) -> str:
    return _setting(host_vars, "tensorrt_user", _setting(host_vars, "mindspore_user", "msgpu"))


@pytest.fixture(scope="module")
def venv(host, host_vars, user, stack) -> str:
    home = host.check_output(f"getent passwd {shlex.quote(user)}").split(":")[5]
    default = _setting(host_vars, "mindspore_venv", f"{home}/venvs/mindspore-{stack['mindspore']['version']}")
    return _setting(host_vars, "tensorrt_venv", default)


@pytest.fixture(scope="module")
def prefix(host_vars, settings, tensorrt) -> str:
    root = _setting(host_vars, "tensorrt_install_root", settings.get("install_prefix") or "/usr/local")
    return f"{root}/TensorRT-{tensorrt['version']}"


@pytest.fixture(scope="module")
def env_file(host_vars, stack, tensorrt) -> str:
    return f"{_setting(host_vars, 'tensorrt_env_dir', '/etc/msgpu/env')}/tensorrt-{stack['name']}.sh"


def _as_user(host, user: str, script: str, timeout: int = 300):
    """Run `script` in a fresh login shell of `user` (what a job script of theirs gets)."""
    return host.run(f"timeout {timeout} su - {shlex.quote(user)} -c {shlex.quote(script)}")


@pytest.fixture(scope="module")
def loaded(host, user, env_file) -> dict:
    result = _as_user(host, user, f". {shlex.quote(env_file)} && python -c {shlex.quote(PROBE)}")
    assert result.rc == 0, f"TensorRT does not load as {user} with {env_file}:\n{result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_libnvinfer_reports_the_expected_version(loaded, host_vars, tensorrt):
    expected = int(_setting(host_vars, "tensorrt_expected_version", str(version_code(tensorrt["version"]))))
    assert loaded["version"] == expected


def test_python_binding_is_the_same_release_as_the_library(loaded, venv):
    assert version_code(loaded["python"]) == loaded["version"]
    assert loaded["python_file"].startswith(f"{venv}/"), "tensorrt must import from the MindSpore virtualenv"


def test_tarball_prefix_has_the_symlink_chain_and_belongs_to_root(host, prefix, tensorrt, loaded):
    if tensorrt["method"] != "tarball":
        pytest.skip("the wheel method installs no prefix")
    assert loaded["libdir"] == f"{prefix}/lib"
    lib = host.file(f"{prefix}/lib/libnvinfer.so")
    assert lib.is_symlink and host.file(f"{prefix}/lib/{lib.linked_to.rsplit('/', 1)[-1]}").exists
    assert host.file(prefix).user == "root" and not host.file(prefix).mode & 0o022
    foreign = host.check_output(f"find {shlex.quote(prefix)} ! -user root -print")
    assert foreign == "", f"files in {prefix} not owned by root:\n{foreign}"
    # The marker (written last) holds the sha256 of the tarball that was unpacked: the one the stack pins
    # (the inventory's stack_artifact_checksums), else that of the controller's copy (stack_local_artifacts).
    marker = host.file(f"{prefix}/.msgpu-installed")
    assert marker.is_file and marker.user == "root" and marker.mode == 0o644
    assert marker.content_string.strip() == tarball_sha256(tensorrt["artifact"])
    # Once unpacked, the host keeps no copy of the tarball (the role's default artifact folder).
    left = host.file(f"/var/cache/msgpu/artifacts/{tensorrt['artifact']['file']}")
    assert not left.exists, f"{left.path}: the unpacked tarball is still on the host"


def test_python_packages_of_the_method_are_installed(host, user, venv, tensorrt):
    if tensorrt["method"] == "wheel":
        expected = {tensorrt["artifact"]["package"]: tensorrt["version"]}
    else:
        files = [path.rsplit("/", 1)[-1] for path in tensorrt["artifact"]["python_wheels"]]
        expected = {name: version for name, version in (file.split("-")[:2] for file in files)}
    for name, version in expected.items():
        result = _as_user(host, user, f"{shlex.quote(venv)}/bin/python -c {shlex.quote(METADATA)} {shlex.quote(name)}")
        assert result.rc == 0 and result.stdout.strip() == version, (name, result.stderr[-500:])


def test_env_file_is_root_owned_and_not_writable_by_others(host, env_file):
    env = host.file(env_file)
    assert env.is_file and env.user == "root" and env.group == "root"
    assert env.mode == 0o644


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_env_file_puts_tensorrt_first_and_is_idempotent(host, user, env_file, loaded, shell):
    source = f". {shlex.quote(env_file)}"
    script = f'{source}; a=$LD_LIBRARY_PATH; {source}; echo "$a"; echo "$LD_LIBRARY_PATH"'
    result = _as_user(host, user, f"{shell} -c {shlex.quote(script)}")
    assert result.rc == 0, result.stderr
    first, second = result.stdout.strip().splitlines()[-2:]
    assert first == second
    entries = first.split(":")
    assert entries[0] == loaded["libdir"] and "" not in entries and len(entries) == len(set(entries))
