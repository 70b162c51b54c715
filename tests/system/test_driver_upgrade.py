"""Driver branch changes on the provisioned host, with real DKMS builds and Canonical's real signed modules:
the stack's 470 -> 535 (DKMS) with the whole site.yml; 535 from DKMS to Canonical's signed precompiled
modules (nvidia_driver_module: precompiled, the Secure Boot path); then `stack_driver_branch: auto` (on
this GPU-less host: the newest catalog branch, 570), on Canonical's precompiled modules again (a branch
change between precompiled branches; DKMS builds of a new branch are the 470 -> 535 step's, and one for
each further branch would double this module's time on the suite's critical path).

`./toolkit test` runs this module on molecule default's converged host after the other system tests and
before test_uninstall.py (tests/system/conftest.py orders it), which then removes whichever branch is left.
It asserts that each change leaves exactly the new branch (its module for every kernel, its packages
installed and held, no package of the old branch or the other module source), that CUDA, cuDNN, NCCL,
TensorRT, the MindSpore venv and the env files are untouched (their files' change times, modes, owners and
sizes), that each re-run changes nothing, and that the doctor explains the state a GPU host is in until its
reboot (the old module still loaded: substituted /sys/module/nvidia/version).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.system.conftest import BRANCH_PACKAGE, CATALOG, ROOT, changed, on_host, playbook

# In `./toolkit test --full` only (cold DKMS builds of a second branch: about half an hour on two cores;
# testbed/scenarios.py: EXTENDED_MARKER).
pytestmark = pytest.mark.extended

STACK = CATALOG["stacks"][CATALOG["default_stack"]]
BRANCHES = CATALOG["driver"]
FROM = STACK["driver_branch"]
TO = "535"
# What `auto` picks on a host without GPUs: the newest catalog branch with distro packages that meets the
# stack's CUDA minimum (every branch does for CUDA 11.1).
AUTO = max((b for b in BRANCHES if "distro" in BRANCHES[b]), key=lambda b: [int(x) for x in b.split(".")])
# Every file of the other components, with what a rewrite cannot hide (ctime) and what a chmod/chown shows.
UNTOUCHED = (
    "find /usr/local/cuda-* /usr/local/cuda /usr/local/TensorRT-* /home/*/venvs /etc/msgpu/env /etc/ld.so.conf.d "
    "-xdev -printf '%y %p %s %m %u:%g %C@ %l\\n' 2>/dev/null | sort"
)


def driver_state(host: str) -> dict:
    packages = on_host(host, "dpkg-query -W -f='${db:Status-Status} ${Package}\\n'").stdout.splitlines()
    installed = sorted(line.split()[1] for line in packages if line.startswith("installed "))
    kernels = on_host(host, "for d in /lib/modules/*; do [ -e $d/build/Makefile ] && basename $d; done").stdout.split()
    return {
        "dkms": sorted(on_host(host, "dkms status -m nvidia").stdout.strip().splitlines()),
        "kernels": sorted(kernels),
        "branch_packages": [p.split(":")[0] for p in installed if BRANCH_PACKAGE.match(p.split(":")[0])],
        "held": sorted(p.split(":")[0] for p in on_host(host, "apt-mark showhold").stdout.split()),
    }


def assert_only(branch: str, state: dict) -> None:
    """Exactly `branch`: its DKMS module installed for every kernel with headers, only its packages, held."""
    assert state["kernels"], state
    built = [re.fullmatch(rf"nvidia, {branch}\.[0-9.]+, (\S+), x86_64: installed", line) for line in state["dkms"]]
    assert all(built) and sorted(m.group(1) for m in built) == state["kernels"], state
    others = [p for p in state["branch_packages"] if not re.search(rf"-{branch}(-|$)", p)]
    assert others == [], f"packages of another branch are left: {others}"
    wanted = sorted(BRANCHES[branch]["distro"]["packages"])
    assert [p for p in wanted if p in state["branch_packages"]] == wanted, state
    assert [p for p in state["held"] if BRANCH_PACKAGE.match(p)] == wanted, state["held"]


@pytest.fixture(scope="module")
def before(host: str) -> dict:
    return {"driver": driver_state(host), "untouched": on_host(host, UNTOUCHED).stdout}


@pytest.fixture(scope="module")
def to_535(inventory: Path, host: str, before: dict) -> dict:
    proc, wall = playbook(inventory, {"stack_driver_branch": TO})
    print(f"site.yml, branch {FROM} -> {TO}: {wall:.1f} s wall")
    state = {"proc": proc, "wall": wall, "driver": driver_state(host), "untouched": on_host(host, UNTOUCHED).stdout}
    again, wall_again = playbook(inventory, {"stack_driver_branch": TO})
    print(f"site.yml, branch {TO} again: {wall_again:.1f} s wall")
    state.update({"again": again, "wall_again": wall_again})
    return state


def precompiled_state(host: str, branch: str) -> dict:
    """Each installed kernel's module of the branch from Canonical's package: its signer."""
    script = (
        "for image in /boot/vmlinuz-*; do k=${image#/boot/vmlinuz-}; "
        f"m=/lib/modules/$k/kernel/nvidia-{branch}/nvidia.ko; "
        'echo "$k|$(modinfo -F signer $m 2>/dev/null)|$(modinfo -F version $m 2>/dev/null)"; done'
    )
    rows = [line.split("|") for line in on_host(host, script).stdout.splitlines()]
    return {k: {"signer": signer, "version": version} for k, signer, version in rows}


def assert_precompiled(branch: str, state: dict, modules: dict) -> None:
    """Exactly `branch` on Canonical's signed modules: no DKMS module, only the branch's packages (its
    user space held), its module package for every installed kernel, each module signed by Canonical."""
    assert state["dkms"] == [], state  # the DKMS package and its modules are gone
    user_space = sorted(p for p in BRANCHES[branch]["distro"]["packages"] if not p.startswith("nvidia-dkms-"))
    assert [p for p in state["held"] if BRANCH_PACKAGE.match(p)] == user_space, state["held"]
    assert f"linux-modules-nvidia-{branch}-generic" in state["branch_packages"], state
    assert not [p for p in state["branch_packages"] if not re.search(rf"-{branch}(-|$)", p)], state
    assert modules and all(m["signer"] == "Canonical Ltd. Kernel Module Signing" for m in modules.values()), modules
    assert all(m["version"].startswith(f"{branch}.") for m in modules.values()), modules
    for kernel in modules:
        assert f"linux-modules-nvidia-{branch}-{kernel}" in state["branch_packages"], (kernel, state)


@pytest.fixture(scope="module")
def to_precompiled(inventory: Path, host: str, to_535: dict) -> dict:
    tags = "preflight,nvidia_driver"
    settings = {"stack_driver_branch": TO, "nvidia_driver_module": "precompiled"}
    proc, wall = playbook(inventory, settings, tags)
    print(f"site.yml --tags {tags}, branch {TO} DKMS -> precompiled: {wall:.1f} s wall")
    state = {
        "proc": proc,
        "driver": driver_state(host),
        "modules": precompiled_state(host, TO),
        "untouched": on_host(host, UNTOUCHED).stdout,
    }
    again, wall_again = playbook(inventory, settings, tags)
    print(f"site.yml --tags {tags}, precompiled again: {wall_again:.1f} s wall")
    state.update({"again": again})
    return state


@pytest.fixture(scope="module")
def to_auto(inventory: Path, host: str, to_precompiled: dict) -> dict:
    tags = "preflight,nvidia_driver"
    settings = {"stack_driver_branch": "auto", "nvidia_driver_module": "precompiled"}
    proc, wall = playbook(inventory, settings, tags)
    print(f"site.yml --tags {tags}, branch {TO} -> auto ({AUTO}), precompiled: {wall:.1f} s wall")
    state = {
        "proc": proc,
        "wall": wall,
        "driver": driver_state(host),
        "modules": precompiled_state(host, AUTO),
        "untouched": on_host(host, UNTOUCHED).stdout,
    }
    again, wall_again = playbook(inventory, settings, tags)
    print(f"site.yml --tags {tags}, auto again: {wall_again:.1f} s wall")
    state.update({"again": again})
    return state


def test_the_host_starts_on_the_stacks_branch(before: dict) -> None:
    assert FROM == "470" and FROM != TO
    assert_only(FROM, before["driver"])
    assert before["untouched"].count("\n") > 1000, before["untouched"][:2000]


def test_the_branch_change_converges(to_535: dict, host: str) -> None:
    assert changed(to_535["proc"], host) > 0
    assert "removing the driver packages of other branches" in " ".join(to_535["proc"].stdout.split())


def test_only_the_new_branch_is_left_built_and_held(to_535: dict) -> None:
    assert_only(TO, to_535["driver"])


def test_cuda_cudnn_nccl_tensorrt_and_the_venv_are_untouched(before: dict, to_535: dict) -> None:
    assert to_535["untouched"] == before["untouched"]


def test_a_rerun_after_the_change_changes_nothing(to_535: dict, host: str) -> None:
    assert changed(to_535["again"], host) == 0


def test_precompiled_modules_replace_dkms_signed_by_canonical(to_precompiled: dict, before: dict, host: str) -> None:
    assert changed(to_precompiled["proc"], host) > 0
    assert_precompiled(TO, to_precompiled["driver"], to_precompiled["modules"])
    assert to_precompiled["untouched"] == before["untouched"]
    assert changed(to_precompiled["again"], host) == 0


def test_auto_chooses_the_newest_branch_says_why_and_moves_to_it(to_auto: dict, before: dict, host: str) -> None:
    assert AUTO == "570"
    assert changed(to_auto["proc"], host) > 0
    assert f'auto chose "{AUTO}"' in " ".join(to_auto["proc"].stdout.split())
    assert_precompiled(AUTO, to_auto["driver"], to_auto["modules"])
    assert to_auto["untouched"] == before["untouched"]
    assert changed(to_auto["again"], host) == 0


def test_the_doctor_explains_a_host_not_yet_rebooted(to_auto: dict, host: str) -> None:
    """On a GPU host the old module stays loaded until the reboot (nvidia_driver_reboot: false, or before
    it): the loaded version is substituted, the user-space library is the host's real new one."""
    loaded = "470.256.02"
    doctor = ROOT / "verify" / "msgpu_verify" / "doctor"  # the doctor's folder runs as a file
    subprocess.run(["docker", "cp", str(doctor), f"{host}:/tmp/msgpu-doctor"], check=True)
    proc = on_host(
        host,
        f"mkdir -p /tmp/msgpu-sys/module/nvidia && echo {loaded} > /tmp/msgpu-sys/module/nvidia/version && "
        "python3 /tmp/msgpu-doctor --sys /tmp/msgpu-sys --json -; rc=$?; "
        "rm -rf /tmp/msgpu-sys /tmp/msgpu-doctor; exit $rc",
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = {f["id"]: f for f in json.loads(proc.stdout)["findings"]}
    mismatch = found["nvml-mismatch"]
    assert loaded in mismatch["title"] and BRANCHES[AUTO]["version"] in mismatch["title"], mismatch
    assert "reboot" in mismatch["fix"], mismatch
