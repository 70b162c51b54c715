"""Fixtures for tests against real sandbox containers (Ubuntu 20.04, and Debian 11 as an
unsupported OS). Containers are created once per session and removed afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

from testbed import fingerprint, fixtures, mirror, sandbox, scenarios  # noqa: E402
from tests.conftest import unpinned_files  # noqa: E402

# The host's state (packages, users, units, every file changed since the marker that _start touches,
# large files left in /tmp and /run): testbed/fingerprint.py, which says what it leaves out and why.
FINGERPRINT = fingerprint.script(marker="/msgpu-marker")


@dataclass
class Host:
    name: str

    def sh(self, script: str) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "exec", self.name, "bash", "-c", script], text=True, capture_output=True)

    def fingerprint(self) -> str:
        result = self.sh(FINGERPRINT)
        assert result.returncode == 0, result.stderr
        return result.stdout


@dataclass
class PlaybookRun:
    rc: int
    output: str


def run_playbook(
    playbook: str, inventory: Path, extra_vars: dict | None = None, args: list[str] | None = None, timeout: int = 600
) -> PlaybookRun:
    """`timeout`: the run's limit in seconds (a converge with a DKMS build beside another stage wants more)."""
    cmd = [str(Path(sys.prefix) / "bin" / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / playbook)]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    cmd += args or []
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=ROOT, timeout=timeout)
    return PlaybookRun(result.returncode, result.stdout + result.stderr)


def _start(name: str, flavour: str) -> Host:
    sandbox.start_host(name, flavour)
    host = Host(name)
    assert host.sh("touch /msgpu-marker").returncode == 0
    return host


@contextmanager
def host_with_mirror(
    name: str, folder: Path, settings: dict, compiler_cache: bool = False
) -> Iterator[tuple[Host, mirror.Mirror, Path]]:
    """A fresh focal host called `name`, the loopback fixture mirror serving it, and its inventory in `folder`
    (the sandbox hosts' group vars with the mirror as NVIDIA's sources, then `settings`); the host is
    removed afterwards. `compiler_cache`: its DKMS builds go through the test bed's compiler cache."""
    root = fixtures.build_mirror()
    sandbox.stop_host(name)
    sandbox.start_host(name, compiler_cache=compiler_cache)
    try:
        with mirror.serving(root) as served:
            group_vars = scenarios.sandbox_group_vars(root, fixtures.inventory_vars(root, served.base_url))
            inventory = sandbox.write_inventory(folder / "inventory.yml", [name], {**group_vars, **settings})
            yield Host(name), served, inventory
    finally:
        sandbox.stop_host(name)


@pytest.fixture(scope="session")
def focal_host() -> Iterator[Host]:
    host = _start("msgpu-it-focal", "focal")
    yield host
    sandbox.stop_host(host.name)


@pytest.fixture(scope="session")
def bullseye_host() -> Iterator[Host]:
    host = _start("msgpu-it-bullseye", "bullseye")
    yield host
    sandbox.stop_host(host.name)


def pinned_stand_ins(catalog: dict) -> dict:
    """NVIDIA's unpinned files get stand-in checksums (the preflight only checks their form; these tests
    download nothing)."""
    return {
        "stack_artifact_checksums": {name: "ab" * 32 for name in unpinned_files(catalog)},
        # Stand-in checksums cannot be fetched into the controller's cache: downloads stay per host.
        "stack_artifact_cache_dir": "",
    }


@pytest.fixture
def inventory_for(tmp_path: Path, catalog):
    """An inventory for `hosts`, with pinned_stand_ins."""

    def make(*hosts: Host, group_vars: dict | None = None, down: tuple[Host, ...] = ()) -> Path:
        pinned = pinned_stand_ins(catalog)
        names = [h.name for h in hosts]
        return sandbox.write_inventory(
            tmp_path / "inventory.yml", names, {**pinned, **(group_vars or {})}, down=[h.name for h in down]
        )

    return make


# "fatal: [host]: FAILED! =>" and the task's result: YAML on the lines below it (ansible.cfg's
# callback_result_format), or JSON on the same line.
_FAILED = re.compile(r"^fatal: \[([^\]]+)\]: FAILED! =>(.*)$")


def refusals_by_host(output: str) -> dict[str, list[str]]:
    """Every line of every failed task's message in a run's output, by host, as the task gave it: a
    refusal line ("stack_cuda_version: ...; allowed: 11.1") stays one item, however the callback wrapped it."""
    lines = output.splitlines()
    found: dict[str, list[str]] = {}
    for index, line in enumerate(lines):
        match = _FAILED.match(line)
        if not match:
            continue
        if match.group(2).strip():
            result = json.loads(match.group(2))
        else:
            block = []
            for following in lines[index + 1 :]:
                if following.strip() and not following[:1].isspace():
                    break
                block.append(following)
            result = yaml.safe_load(textwrap.dedent("\n".join(block))) or {}
        message = result.get("msg", "") if isinstance(result, dict) else ""
        mine = found.setdefault(match.group(1), [])
        for item in message if isinstance(message, list) else [message]:
            mine.extend(str(item).splitlines())
    return found


def refusals(output: str) -> list[str]:
    """Every line of every failed task's message in a run's output (refusals_by_host, all hosts). A test
    that wants the variable's own line to say what is allowed looks there, not in the whole output (where
    another line may carry the same words)."""
    return [line for lines in refusals_by_host(output).values() for line in lines]


@dataclass
class Refused:
    lines: list[str]  # the lines of this case's refusal
    output: str  # the whole output of the run that refused it


def refuse_together(
    host: Host, folder: Path, cases: dict[str, dict], group_vars: dict, playbook: str = "site.yml"
) -> dict[str, Refused]:
    """Each case (a name: its settings) refused by `playbook`, with as few runs as the preflight allows.

    Every case is an inventory host of its own that reaches the same container (`ansible_host`), its settings
    as its host vars (over `group_vars`, as -e would be), and one run takes them all: each host's refusal is
    computed from its own settings and reported under its own name. The preflight stops every host after
    the first task where one fails (any_errors_fatal), so that run refuses the cases of that task; the
    others run again, until each case has its refusal or a run refuses none of those left. Returns the
    cases refused; the caller checks that each one was, and the host's fingerprint around all the runs."""
    pending = dict(cases)
    refused: dict[str, Refused] = {}
    for attempt in range(1, len(cases) + 1):
        inventory = sandbox.write_inventory(
            folder / f"inventory-{attempt}.yml",
            list(pending),
            group_vars,
            host_vars={name: {"ansible_host": host.name, **settings} for name, settings in pending.items()},
        )
        result = run_playbook(playbook, inventory)
        by_host = refusals_by_host(result.output)
        new = {name: Refused(by_host[name], result.output) for name in pending if by_host.get(name)}
        if not new:
            break
        refused.update(new)
        pending = {name: settings for name, settings in pending.items() if name not in new}
        if not pending:
            break
    return refused


def pci_tree_script(root: str, functions: list[tuple[str, str]]) -> str:
    """A shell script that writes a substituted sysfs PCI bus under root: one function (device, class) per
    slot 0000:10:00.0, 0000:11:00.0, ... (stack_sysfs_root points the preflight at it)."""
    lines = ["set -e"]
    for index, (device, klass) in enumerate(functions):
        slot = f"{root}/bus/pci/devices/0000:{0x10 + index:02x}:00.0"
        lines.append(
            f"mkdir -p {slot} && echo 0x10de > {slot}/vendor && echo {device} > {slot}/device "
            f"&& echo {klass} > {slot}/class"
        )
    return "\n".join(lines)
