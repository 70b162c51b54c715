"""`./toolkit uninstall` (site.yml with every component's state: absent) on the provisioned host.

`./toolkit test` runs this module on molecule default's converged host after the other system tests
(tests/system/conftest.py orders it last: it removes what they use). It asserts the host had each
component before, has none of it after, and that a second uninstall changes nothing. Names and
versions come from the catalog (the default stack), as the roles take them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

# BRANCH_PACKAGE: any branch's driver packages: test_driver_upgrade.py, which runs just before, leaves another
# branch than the stack's, and the uninstall must remove whichever the host has.
from tests.system.conftest import BRANCH_PACKAGE, CATALOG, on_host, recap, uninstall

STACK = CATALOG["stacks"][CATALOG["default_stack"]]
CUDA = STACK["cuda"]
OPENMPI_PACKAGES = CATALOG["openmpi"][STACK["openmpi"]]["distro"]["ubuntu-20.04"]


def state(host: str) -> dict[str, object]:
    """What the host has of each component."""

    def installed(packages: list[str]) -> list[str]:
        out = on_host(host, "dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' " + " ".join(packages)).stdout
        # db:Status-Abbrev: the wanted state ("i"nstall, "h"old, ...) then the status ("i"nstalled, ...)
        return sorted(fields[0] for fields in map(str.split, out.splitlines()) if fields[1:] and fields[1][1:2] == "i")

    every = on_host(host, "dpkg-query -W -f='${Package}\\n'").stdout.split()

    def exists(path: str) -> bool:
        return on_host(host, f"test -e {path} || test -L {path}").returncode == 0

    return {
        "dkms": on_host(host, "dkms status 2>/dev/null | grep -i '^nvidia' || true").stdout.strip(),
        "driver_packages": installed([p for p in every if BRANCH_PACKAGE.match(p)] or ["nvidia-dkms-470"]),
        "held": sorted(on_host(host, "apt-mark showhold").stdout.split()),
        "blacklist": exists("/etc/modprobe.d/blacklist-nouveau.conf"),
        "cuda_tree": exists(f"/usr/local/cuda-{CUDA}"),
        "cuda_link": exists("/usr/local/cuda"),
        "cuda_env": exists(f"/etc/msgpu/env/cuda-{CUDA}.sh"),
        "libraries": on_host(
            host, "find /usr/local -name 'libcudnn*' -o -name 'libnccl*' -o -name '.msgpu-*' | sort"
        ).stdout.split(),
        "openmpi": installed(OPENMPI_PACKAGES),
        "venvs": on_host(host, "ls -d /home/*/venvs/mindspore-* 2>/dev/null || true").stdout.split(),
        "mindspore_env": on_host(host, "ls /etc/msgpu/env/mindspore-*.sh 2>/dev/null || true").stdout.split(),
        "tensorrt": on_host(
            host, "ls -d /usr/local/TensorRT-* /etc/msgpu/env/tensorrt-*.sh 2>/dev/null || true"
        ).stdout.split(),
    }


@pytest.fixture(scope="module")
def before(host: str) -> dict[str, object]:
    return state(host)


@pytest.fixture(scope="module")
def checked(inventory: Path, host: str, before: dict[str, object]) -> dict[str, object]:
    """`./toolkit uninstall --check`: what would be removed, and the host as it was."""
    proc, wall = uninstall(inventory, "--check")
    print(f"uninstall --check: {wall:.1f} s wall")
    return {"proc": proc, "state": state(host)}


@pytest.fixture(scope="module")
def component(inventory: Path, host: str, checked: dict[str, object]) -> dict[str, object]:
    """`./toolkit uninstall --component tensorrt`: TensorRT alone, before the whole stack goes."""
    proc, wall = uninstall(inventory, "--component", "tensorrt")
    print(f"uninstall --component tensorrt: {wall:.1f} s wall")
    return {"proc": proc, "state": state(host)}


@pytest.fixture(scope="module")
def first(inventory: Path, component: dict[str, object]) -> tuple[subprocess.CompletedProcess, float]:
    proc, wall = uninstall(inventory)
    print(f"uninstall: {wall:.1f} s wall")
    return proc, wall


@pytest.fixture(scope="module")
def after(host: str, first: tuple[subprocess.CompletedProcess, float]) -> dict[str, object]:
    return state(host)


@pytest.fixture(scope="module")
def second(inventory: Path, after: dict[str, object]) -> tuple[subprocess.CompletedProcess, float]:
    proc, wall = uninstall(inventory)
    print(f"uninstall again: {wall:.1f} s wall")
    return proc, wall


def test_the_host_had_the_stack_before(before):
    # The stack's branch with its DKMS module, or (after test_driver_upgrade.py, in --full) the branch `auto`
    # chose on Canonical's precompiled modules: the module package for a kernel instead of nvidia-dkms-<branch>.
    kind = re.compile(r"^(nvidia-dkms|linux-modules-nvidia)-([0-9]{3})(-generic)?$")
    found = {(m.group(1), m.group(2)) for m in map(kind.match, before["driver_packages"]) if m}
    assert len(found) == 1, before["driver_packages"]
    (source, branch) = found.pop()
    if source == "nvidia-dkms":
        assert before["dkms"] and "installed" in str(before["dkms"]), before
    packages = CATALOG["driver"][branch]["distro"]["packages"]
    wanted = [p for p in packages if source == "nvidia-dkms" or "-dkms-" not in p]
    assert set(wanted) <= set(before["driver_packages"]) and set(wanted) <= set(before["held"]), before
    assert before["cuda_tree"] and before["cuda_link"] and before["cuda_env"], before
    assert any("libcudnn" in f for f in before["libraries"]) and any("libnccl" in f for f in before["libraries"])
    assert before["openmpi"] and before["venvs"] and before["mindspore_env"], before


def test_uninstall_check_reports_removals_and_changes_nothing(host, before, checked):
    proc = checked["proc"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    changed, unreachable, failed = recap(proc)[host]
    assert changed > 0 and (unreachable, failed) == (0, 0), proc.stdout[-3000:]
    assert checked["state"] == before


def test_uninstall_of_one_component_removes_it_alone(host, before, component):
    proc = component["proc"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    changed, unreachable, failed = recap(proc)[host]
    assert changed > 0 and (unreachable, failed) == (0, 0), proc.stdout[-3000:]
    left = component["state"]
    assert before["tensorrt"] and left["tensorrt"] == [], left["tensorrt"]

    def without_tensorrt(found: dict[str, object]) -> dict[str, object]:
        # TensorRT's prefix marker (/usr/local/TensorRT-*/.msgpu-installed) is among the listed markers.
        libraries = [f for f in found["libraries"] if not f.startswith("/usr/local/TensorRT-")]
        return {**{k: v for k, v in found.items() if k != "tensorrt"}, "libraries": libraries}

    assert without_tensorrt(left) == without_tensorrt(before)


def test_uninstall_succeeds(first):
    proc, _ = first
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert recap(proc) and all(f == 0 and u == 0 for _, u, f in recap(proc).values()), proc.stdout[-3000:]


def test_driver_module_packages_holds_and_blacklist_are_gone(after):
    assert after["dkms"] == "", after["dkms"]
    assert after["driver_packages"] == [], after
    assert not [p for p in after["held"] if BRANCH_PACKAGE.match(p.split(":")[0])], after["held"]
    assert not after["blacklist"]


def test_cuda_toolkit_link_and_env_file_are_gone(after):
    assert not after["cuda_tree"] and not after["cuda_link"] and not after["cuda_env"], after


def test_no_cudnn_nccl_or_marker_file_is_left_under_usr_local(after):
    assert after["libraries"] == [], after["libraries"]


def test_openmpi_and_the_mindspore_venv_are_gone(after):
    assert after["openmpi"] == [], after
    assert after["venvs"] == [] and after["mindspore_env"] == [], after


def test_tensorrt_is_gone(before, after):
    # molecule default installs TensorRT's tarball (stack_tensorrt_enabled): without it this test proves nothing.
    assert any(p.startswith("/usr/local/TensorRT-") for p in before["tensorrt"]), before["tensorrt"]
    assert any(p.startswith("/etc/msgpu/env/tensorrt-") for p in before["tensorrt"]), before["tensorrt"]
    assert after["tensorrt"] == [], after["tensorrt"]


def test_a_second_uninstall_changes_nothing(second):
    proc, _ = second
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert recap(proc) and all(c == 0 for c, _, _ in recap(proc).values()), proc.stdout[-3000:]
