"""CUDA toolkits: every toolkit of the stack side by side, each usable through its own env script.

The toolkits come from the host's stack settings (stack_cuda_extra_versions adds some), so they
are known only once the host is: each test checks every toolkit in a subtest of its own. How a
toolkit got there depends on the method (stack_cuda_method): a runfile install carries the role's
marker file, a cuda_repo install is a package dpkg owns; everything else is common.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex

import pytest

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _role_setting(host, name: str, default):
    """A `cuda` role variable as the inventory sets it (the role's default otherwise)."""
    if host.backend.NAME == "ansible":
        value = host.ansible.get_variables().get(name)
        if value is not None and "{{" not in str(value):
            return value
    return default


@pytest.fixture(scope="module")
def install_root(host, settings) -> str:
    return str(_role_setting(host, "cuda_install_root", settings.get("install_prefix") or "/usr/local"))


@pytest.fixture(scope="module")
def env_dir(host) -> str:
    return str(_role_setting(host, "cuda_env_dir", "/etc/msgpu/env"))


@pytest.fixture(scope="module")
def artifact_dir(host) -> str:
    return str(_role_setting(host, "cuda_artifact_dir", "/var/cache/msgpu/artifacts"))


@pytest.fixture(scope="module")
def modulefiles_dir(host) -> str:
    return str(_role_setting(host, "cuda_modulefiles_dir", "/etc/msgpu/modulefiles"))


@pytest.fixture(scope="module")
def toolkits(stack) -> list[dict]:
    assert stack["cuda"]["toolkits"], "the resolved stack lists no CUDA toolkit"
    return stack["cuda"]["toolkits"]


def _prefix(install_root: str, toolkit: dict) -> str:
    return f"{install_root}/cuda-{toolkit['version']}"


def _in_login_shell(host, script: str):
    """Run `script` in a fresh bash login shell (what a user's job script gets)."""
    return host.run(f"env -i HOME=/root TERM=dumb bash -lc {shlex.quote(script)}")


def test_toolkit_tree_carries_the_install_marker(host, install_root, artifact_dir, toolkits, stack, subtests):
    if stack["cuda"]["method"] != "runfile":
        pytest.skip("only runfile installs carry the marker (dpkg records package installs)")
    for toolkit in toolkits:
        with subtests.test(cuda=toolkit["version"]):
            prefix = _prefix(install_root, toolkit)
            assert host.file(prefix).is_directory
            marker = host.file(f"{prefix}/.msgpu-installed")
            assert marker.is_file, "no marker: the install did not finish"
            content = marker.content_string.strip()
            # A local artifact without a pinned checksum: the role records the one it computed.
            expected = toolkit["artifact"].get("sha256") or content
            assert SHA256_RE.match(content)
            assert content == expected
            # Once the marker is written the host keeps no copy of the runfile (3-4 GB for a real one).
            runfile = f"{artifact_dir}/{toolkit['artifact']['file']}"
            assert not host.file(runfile).exists, f"{runfile}: the installed runfile is still on the host"


def test_toolkit_tree_belongs_to_its_package(host, install_root, toolkits, stack, subtests):
    if stack["cuda"]["method"] != "cuda_repo":
        pytest.skip("only cuda_repo installs toolkits as packages")
    for toolkit in toolkits:
        with subtests.test(cuda=toolkit["version"]):
            prefix = _prefix(install_root, toolkit)
            for package in toolkit["artifact"]["packages"]:
                assert host.package(package).is_installed, package
            owner = host.check_output(f"dpkg-query --search {shlex.quote(prefix + '/lib64/libcudart.so.11.0')}")
            assert owner.split(":")[0] in toolkit["artifact"]["packages"]
            assert not host.file(f"{prefix}/.msgpu-installed").exists
            # Once installed, apt's cache keeps no copy of the packages (GBs for NVIDIA's real ones).
            for package in toolkit["artifact"]["packages"]:
                kept = host.run(f"ls /var/cache/apt/archives/{shlex.quote(package)}_*.deb").stdout.split()
                assert not kept, f"{kept}: the installed toolkit's package is still in apt's cache"


def test_version_json_reports_the_full_version(host, install_root, toolkits, subtests):
    for toolkit in toolkits:
        with subtests.test(cuda=toolkit["version"]):
            data = json.loads(host.file(f"{_prefix(install_root, toolkit)}/version.json").content_string)
            assert data["cuda"]["version"] == toolkit["full_version"]


def test_env_script_selects_the_toolkit(host, install_root, env_dir, toolkits, subtests):
    for toolkit in toolkits:
        with subtests.test(cuda=toolkit["version"]):
            prefix = _prefix(install_root, toolkit)
            cmd = _in_login_shell(
                host,
                f'. {env_dir}/cuda-{toolkit["version"]}.sh && command -v nvcc && echo "$CUDA_HOME" '
                '&& echo "$LD_LIBRARY_PATH" && nvcc --version',
            )
            assert cmd.rc == 0, cmd.stderr
            nvcc, cuda_home, ld_path, *version = cmd.stdout.splitlines()
            assert nvcc == f"{prefix}/bin/nvcc"
            assert cuda_home == prefix
            assert ld_path.split(":")[0] == f"{prefix}/lib64"
            assert not ld_path.endswith(":"), "an empty entry would put the current directory on the path"
            assert f"release {toolkit['version']}, V{toolkit['full_version']}" in "\n".join(version)


def test_sourcing_another_env_script_switches_cleanly(host, install_root, env_dir, toolkits, subtests):
    """Every ordered pair, a toolkit with itself included: the second script wins, nothing doubles."""
    for first, second in itertools.product(toolkits, repeat=2):
        with subtests.test(first=first["version"], then=second["version"]):
            prefix = _prefix(install_root, second)
            cmd = _in_login_shell(
                host,
                f". {env_dir}/cuda-{first['version']}.sh && . {env_dir}/cuda-{second['version']}.sh "
                '&& echo "$PATH" && echo "$LD_LIBRARY_PATH" && nvcc --version',
            )
            assert cmd.rc == 0, cmd.stderr
            path, ld_path, *version = cmd.stdout.splitlines()
            toolkit_entries = [e for e in path.split(":") + ld_path.split(":") if e.startswith(f"{install_root}/cuda")]
            assert toolkit_entries == [f"{prefix}/bin", f"{prefix}/lib64"]
            assert f"release {second['version']}," in "\n".join(version)


def test_cuda_symlink_points_at_the_default_toolkit(host, install_root, stack):
    link = host.file(f"{install_root}/cuda")
    assert link.is_symlink
    assert link.linked_to == f"{install_root}/cuda-{stack['cuda']['version']}"


def test_env_scripts_are_root_owned_and_not_writable_by_others(host, env_dir, toolkits, subtests):
    directory = host.file(env_dir)
    assert directory.is_directory
    assert directory.user == "root"
    assert directory.mode & 0o022 == 0
    for toolkit in toolkits:
        with subtests.test(cuda=toolkit["version"]):
            script = host.file(f"{env_dir}/cuda-{toolkit['version']}.sh")
            assert script.is_file
            assert (script.user, script.group) == ("root", "root")
            assert script.mode & 0o022 == 0


def test_modulefile_names_the_prefix(host, install_root, modulefiles_dir, toolkits, subtests):
    for toolkit in toolkits:
        with subtests.test(cuda=toolkit["version"]):
            modulefile = host.file(f"{modulefiles_dir}/cuda/{toolkit['version']}")
            assert modulefile.is_file
            text = modulefile.content_string
            assert text.startswith("#%Module")
            assert _prefix(install_root, toolkit) in text
            assert re.search(r"^conflict cuda$", text, re.MULTILINE)


def test_cudart_is_an_elf_shared_object(host, install_root, toolkits, subtests):
    for toolkit in toolkits:
        with subtests.test(cuda=toolkit["version"]):
            library = f"{_prefix(install_root, toolkit)}/lib64/libcudart.so.11.0"
            assert host.file(library).exists
            # ELF magic, then e_type (offset 16, little-endian) 3 = ET_DYN, a shared object.
            header = host.check_output(f"od -An -tx1 -N18 {shlex.quote(library)}").split()
            assert header[:4] == ["7f", "45", "4c", "46"]
            assert header[16:18] == ["03", "00"]


def test_login_shells_source_cuda_only_when_asked(host, env_dir, stack):
    profile = host.file("/etc/profile.d/msgpu-cuda.sh")
    if _role_setting(host, "cuda_profile_d", False) in (True, "true", "True"):
        assert f"{env_dir}/cuda-{stack['cuda']['version']}.sh" in profile.content_string
    else:
        assert not profile.exists
