"""The stack role's apt_clean task file (roles/host_utils/tasks/apt_clean.yml) on a real Ubuntu 20.04 container: after
the cuda and cuda_library roles' cuda_repo installs it empties apt's cache of downloaded packages, and a lock
another apt process holds on that cache is waited for instead of failing the run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import sandbox

from .conftest import ROOT, Host, _start

PLAY = """\
- name: The stack role's apt_clean step, as the cuda and cuda_library roles include it
  hosts: all
  gather_facts: false
  tasks:
    - name: Empty apt's cache
      ansible.builtin.include_role:
        name: host_utils
        tasks_from: apt_clean
      vars:
        host_utils_apt_clean_what: the test's packages
"""
ARCHIVES = "/var/cache/apt/archives"
# apt locks its cache with fcntl (POSIX) locks, as lockf takes them; flock would not keep apt out.
HOLD_LOCK = (
    "import fcntl, sys, time; f = open('/var/cache/apt/archives/lock', 'w'); fcntl.lockf(f, fcntl.LOCK_EX); "
    "open('/tmp/msgpu-lock-held', 'w').close(); time.sleep(float(sys.argv[1]))"
)


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    started = _start("msgpu-it-aptclean", "focal")
    yield started
    sandbox.stop_host(started.name)


def run_step(host: Host, tmp_path: Path, check: bool = False) -> subprocess.CompletedProcess:
    (tmp_path / "play.yml").write_text(PLAY)
    inventory = sandbox.write_inventory(tmp_path / "inventory.yml", [host.name])
    cmd = [str(Path(sys.prefix) / "bin" / "ansible-playbook"), "-i", str(inventory), str(tmp_path / "play.yml")]
    cmd += ["--check"] if check else []
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=ROOT, timeout=300)


def cached_debs(host: Host) -> list[str]:
    listing = host.sh(f"ls {ARCHIVES}")
    assert listing.returncode == 0, listing.stderr
    return [name for name in listing.stdout.split() if name.endswith(".deb")]


def test_check_mode_leaves_apts_cache_as_it_is(host, tmp_path):
    assert host.sh(f"echo stand-in > {ARCHIVES}/demo_1.0_amd64.deb").returncode == 0
    result = run_step(host, tmp_path, check=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert cached_debs(host) == ["demo_1.0_amd64.deb"]


def test_a_lock_held_for_a_while_is_waited_for_then_the_cache_is_emptied(host, tmp_path):
    assert host.sh(f"echo stand-in > {ARCHIVES}/demo_1.0_amd64.deb && rm -f /tmp/msgpu-lock-held").returncode == 0
    holder = subprocess.Popen(["docker", "exec", host.name, "python3", "-c", HOLD_LOCK, "12"])
    try:
        deadline = time.monotonic() + 30
        while host.sh("test -e /tmp/msgpu-lock-held").returncode != 0:
            assert time.monotonic() < deadline, "the lock holder did not start"
            time.sleep(0.5)
        result = run_step(host, tmp_path)
    finally:
        holder.wait(timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "FAILED - RETRYING" in output, output  # apt-get clean refused while the lock was held
    assert "Run `sudo apt-get clean`" not in output, output  # the message of a cache left as it was
    assert cached_debs(host) == []
    recap = [line for line in result.stdout.splitlines() if line.startswith(host.name) and "changed=" in line]
    assert recap and "failed=0" in recap[0] and "ignored=0" in recap[0], recap
