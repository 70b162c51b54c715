"""`./toolkit uninstall` for the install methods the default scenario's system tests do not remove, each on its
molecule scenario's converged host: `runfile` (NVIDIA's driver runfile with DKMS: nvidia-uninstall, and a
second CUDA toolkit), `nvidia_repo` (every component from NVIDIA's CUDA apt repository: its packages, its
source, pin and keyring), `wheels` (cuDNN, NCCL and TensorRT from NVIDIA's PyPI wheels). The host had the
method's traces before; none of the stack's traces is left after. (A second uninstall changing nothing is
shown once, on the default scenario's host: tests/system/test_uninstall.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.system.conftest import BRANCH_PACKAGE, on_host, recap, uninstall

# NVIDIA's packages of any component (driver branches, the CUDA repository's toolkit and libraries).
NVIDIA_PACKAGE = re.compile(rf"{BRANCH_PACKAGE.pattern}|^(cuda-.*|libcudnn.*|libnccl.*|libnvinfer.*)$")
LISTS = {
    "dkms": "dkms status 2>/dev/null | grep -i '^nvidia' || true",
    "runfile": (
        "ls /usr/bin/nvidia-uninstall /usr/bin/nvidia-smi /usr/lib/x86_64-linux-gnu/libcuda.so* 2>/dev/null || true"
    ),
    "cuda": "ls -d /usr/local/cuda /usr/local/cuda-* 2>/dev/null || true",
    "libraries": (
        "find /usr/local /usr/lib/x86_64-linux-gnu /home -name 'libcudnn*' -o -name 'libnccl*' -o -name 'libnvinfer*' "
        "2>/dev/null || true"
    ),
    "repo": (
        "ls /etc/apt/sources.list.d/msgpu-* /usr/share/keyrings/msgpu-* /etc/apt/preferences.d/msgpu-* "
        "2>/dev/null || true"
    ),
    "env_files": "ls /etc/msgpu/env/ 2>/dev/null || true",
    "venvs": "ls -d /home/*/venvs/* 2>/dev/null || true",
    "tensorrt": "ls -d /usr/local/TensorRT-* 2>/dev/null || true",
}
# What each scenario's method leaves that the others do not: the host must have had it.
METHOD_TRACES = {
    "runfile": ("runfile", "dkms", "cuda"),
    "nvidia_repo": ("repo", "packages", "dkms"),
    "wheels": ("libraries", "cuda"),
}


def traces(host: str) -> dict[str, list[str]]:
    found = {name: sorted(on_host(host, script).stdout.split("\n")) for name, script in LISTS.items()}
    found = {name: [line for line in lines if line.strip()] for name, lines in found.items()}
    shown = on_host(host, "dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'").stdout.splitlines()
    found["packages"] = sorted(
        line.split()[1] for line in shown if line[1:2] == "i" and NVIDIA_PACKAGE.match(line.split()[1])
    )
    held = on_host(host, "apt-mark showhold").stdout.split()
    found["held"] = sorted(p for p in held if NVIDIA_PACKAGE.match(p.split(":")[0]))
    return found


@pytest.fixture(scope="module")
def before(host: str) -> dict[str, list[str]]:
    return traces(host)


@pytest.fixture(scope="module")
def runs(inventory: Path, host: str, before: dict[str, list[str]]) -> dict:
    first, wall = uninstall(inventory)
    print(f"uninstall: {wall:.1f} s")
    return {"first": first, "after": traces(host)}


def test_the_host_had_the_methods_traces(scenario: str, before: dict[str, list[str]]) -> None:
    missing = [name for name in METHOD_TRACES[scenario] if not before[name]]
    assert missing == [], f"{scenario}: nothing of {missing} before the uninstall: {before}"


def test_uninstall_leaves_nothing_of_the_stack(host: str, runs: dict) -> None:
    proc = runs["first"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    changed, unreachable, failed = recap(proc)[host]
    assert changed > 0 and (unreachable, failed) == (0, 0), proc.stdout[-3000:]
    left = {name: found for name, found in runs["after"].items() if found}
    assert left == {}, left
