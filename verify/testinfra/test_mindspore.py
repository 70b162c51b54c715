"""MindSpore virtualenv: owned by an ordinary user, the stack's release and pins, a clean env file.

The user, the virtualenv path and the env folder are the `mindspore` role's variables as the
inventory sets them (with the ansible backend), its defaults otherwise.
"""

from __future__ import annotations

import re
import shlex

import pytest

# mindspore 1.5 can hang at interpreter exit; os._exit skips the atexit joins.
IMPORT_SCRIPT = "import mindspore, os; print(mindspore.__version__, flush=True); os._exit(0)"
PINS_SCRIPT = """
import importlib.metadata as metadata, sys
from pip._vendor.packaging.requirements import Requirement
for line in sys.argv[1:]:
    requirement = Requirement(line)
    version = metadata.version(requirement.name)
    print(requirement.name, version, requirement.specifier.contains(version, prereleases=True))
"""


def _role_setting(host_vars: dict, name: str, default: str) -> str:
    """A `mindspore` role variable as the inventory sets it (the role's default otherwise)."""
    value = host_vars.get(name)
    return str(value) if value and "{{" not in str(value) else default


@pytest.fixture(scope="module")
def user(host_vars) -> str:
    return _role_setting(host_vars, "mindspore_user", "msgpu")


@pytest.fixture(scope="module")
def home(host, user) -> str:
    entry = host.check_output(f"getent passwd {shlex.quote(user)}")
    return entry.split(":")[5]


@pytest.fixture(scope="module")
def venv(host_vars, home, stack) -> str:
    return _role_setting(host_vars, "mindspore_venv", f"{home}/venvs/mindspore-{stack['mindspore']['version']}")


@pytest.fixture(scope="module")
def env_file(host_vars, stack) -> str:
    return f"{_role_setting(host_vars, 'mindspore_env_dir', '/etc/msgpu/env')}/mindspore-{stack['name']}.sh"


@pytest.fixture(scope="module")
def cuda_lib64(host_vars, settings, stack) -> str:
    root = settings.get("install_prefix") or "/usr/local"
    prefix = _role_setting(host_vars, "mindspore_cuda_prefix", f"{root}/cuda-{stack['cuda']['version']}")
    return f"{prefix}/lib64"


def _as_user(host, user: str, script: str, timeout: int = 300):
    """Run `script` in a fresh login shell of `user` (what a job script of theirs gets)."""
    return host.run(f"timeout {timeout} su - {shlex.quote(user)} -c {shlex.quote(script)}")


def test_owner_is_an_ordinary_user(host, user, home):
    account = host.user(user)
    assert account.exists
    assert account.uid >= 1000, "the virtualenv must not belong to a system account"
    assert host.file(home).is_directory
    assert host.file(home).user == user


def test_every_file_in_the_venv_belongs_to_the_owner(host, user, venv):
    assert host.file(f"{venv}/pyvenv.cfg").is_file
    foreign = host.check_output(f"find {shlex.quote(venv)} ! -user {shlex.quote(user)} -print")
    assert foreign == "", f"files not owned by {user}:\n{foreign}"


def test_venv_uses_the_stack_python(host, venv, python_path):
    cfg = host.file(f"{venv}/pyvenv.cfg").content_string
    home_line = next(line for line in cfg.splitlines() if line.startswith("home"))
    real_python = host.check_output(f"readlink -f {shlex.quote(python_path)}")
    assert home_line.split("=", 1)[1].strip() == real_python.rsplit("/", 1)[0]


def test_install_marker_names_the_wheel(host, user, venv, stack):
    marker = host.file(f"{venv}/.msgpu-installed")
    assert marker.is_file, "no marker: the virtualenv build did not finish"
    assert marker.user == user
    tag = host.check_output(f"{venv}/bin/python -c 'import sys; print(\"cp%d%d\" % sys.version_info[:2])'")
    wheel_sha256 = stack["mindspore"]["wheels"][tag]["sha256"]
    if wheel_sha256:  # a vendor wheel given as a local file: the role records the checksum it computed
        assert f"wheel-sha256={wheel_sha256}" in marker.content_string


def test_constraints_file_holds_the_release_and_the_pins(host, user, venv, stack):
    constraints = host.file(f"{venv}/msgpu-constraints.txt")
    assert constraints.user == user
    lines = [line for line in constraints.content_string.splitlines() if line and not line.startswith("#")]
    ms = stack["mindspore"]
    assert lines == [f"{ms['package']}=={ms['version']}", *ms["pins"]]


def test_login_shell_imports_the_stack_release(host, user, env_file, stack):
    cmd = _as_user(host, user, f". {env_file} && python -c {shlex.quote(IMPORT_SCRIPT)}")
    assert cmd.rc == 0, cmd.stderr
    assert cmd.stdout.strip().splitlines()[-1] == stack["mindspore"]["version"]


def test_installed_packages_satisfy_the_pins(host, venv, stack):
    pins = stack["mindspore"]["pins"]
    cmd = host.run(f"{venv}/bin/python -c {shlex.quote(PINS_SCRIPT)} {' '.join(shlex.quote(p) for p in pins)}")
    assert cmd.rc == 0, cmd.stderr
    results = [line.split() for line in cmd.stdout.splitlines()]
    assert [name for name, _, _ in results] == [re.split(r"[<>=!~;\[ ]", pin)[0] for pin in pins]
    assert all(ok == "True" for _, _, ok in results), results


def test_installed_requirements_are_consistent(host, user, venv):
    cmd = host.run(f"su {shlex.quote(user)} -s /bin/sh -c {shlex.quote(venv + '/bin/python -m pip check')}")
    assert cmd.rc == 0, cmd.stdout + cmd.stderr
    assert "No broken requirements found" in cmd.stdout


def test_env_file_selects_the_venv_and_the_stack_cuda(host, user, venv, env_file, cuda_lib64, stack):
    cmd = _as_user(
        host,
        user,
        f'. {env_file} && command -v python && echo "$LD_LIBRARY_PATH" && echo "$MSGPU_STACK" '
        '&& echo "$MSGPU_MINDSPORE_VERSION" && echo "$PIP_CONSTRAINT" && echo "$CUDA_HOME"',
    )
    assert cmd.rc == 0, cmd.stderr
    python, ld_path, stack_name, version, constraint, cuda_home = cmd.stdout.splitlines()
    assert python == f"{venv}/bin/python"
    assert ld_path.split(":")[0] == cuda_lib64
    assert "" not in ld_path.split(":"), "an empty entry would put the current directory on the path"
    assert stack_name == stack["name"]
    assert version == stack["mindspore"]["version"]
    assert constraint == f"{venv}/msgpu-constraints.txt"
    assert f"{cuda_home}/lib64" == cuda_lib64


def test_sourcing_the_env_file_twice_changes_nothing(host, user, env_file):
    show = 'echo "$PATH"; echo "$LD_LIBRARY_PATH"'
    cmd = _as_user(host, user, f". {env_file} && {{ {show}; }} && . {env_file} && {{ {show}; }}")
    assert cmd.rc == 0, cmd.stderr
    path_once, ld_once, path_twice, ld_twice = cmd.stdout.splitlines()
    assert (path_twice, ld_twice) == (path_once, ld_once)
    assert len(set(path_once.split(":"))) == len(path_once.split(":"))


def test_env_file_is_root_owned_and_not_writable_by_others(host, env_file):
    script = host.file(env_file)
    assert script.is_file
    assert (script.user, script.group) == ("root", "root")
    assert script.mode == 0o644
