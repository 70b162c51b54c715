"""A sandbox host with MindSpore Serving installed for real, shared by the tests of tests/serving.

`serving_host` starts a fresh Ubuntu 20.04 container (msgpu-serving-1), provisions it once with
`site.yml --tags preflight,mindspore,serving` on the catalog's stack whose MindSpore and Serving
wheels both come from PyPI (no NVIDIA component: MindSpore 2.0's wheel imports without CUDA on a
host without a GPU), and removes it at the end of the session (MSGPU_KEEP_SERVING_HOST=1 keeps it).
Tests marked `removes_serving` (the uninstall) run after every other test of the session.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

from testbed import sandbox  # noqa: E402
from tests.conftest import unpinned_files  # noqa: E402

HOST_NAME = "msgpu-serving-1"
# The controller's artifact cache the other sandbox runs use (testbed/scenarios.py ARTIFACT_CACHE): the 950 MB
# MindSpore wheel is fetched once per machine, not once per test run.
ARTIFACT_CACHE = sandbox.CACHE / "artifact-cache"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())


def pypi_serving_stack(catalog: dict) -> str:
    """The first stack whose MindSpore and Serving cp38 wheels both come from PyPI."""
    for name, stack in catalog["stacks"].items():
        serving = catalog.get("serving", {}).get(str(stack.get("serving") or ""), {})
        mindspore = catalog["mindspore"][str(stack["mindspore"])]
        wheels = [serving.get("wheels", {}).get("cp38", {}), mindspore.get("wheels", {}).get("cp38", {})]
        if str(stack["mindspore"]) in serving.get("mindspore", []) and all(w.get("source") == "pypi" for w in wheels):
            return name
    raise LookupError("catalog/stacks.yml has no stack with MindSpore and Serving wheels from PyPI for cp38")


STACK_NAME = pypi_serving_stack(CATALOG)
STACK = CATALOG["stacks"][STACK_NAME]
SERVING = CATALOG["serving"][str(STACK["serving"])]
# Stacks that name no Serving release: enabling Serving there must be refused.
STACKS_WITHOUT_SERVING = [name for name, stack in CATALOG["stacks"].items() if not stack.get("serving")]


@dataclass
class PlaybookRun:
    rc: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        return {
            host: {"ok": int(ok), "changed": int(changed), "unreachable": int(unreachable), "failed": int(failed)}
            for host, ok, changed, unreachable, failed in RECAP.findall(self.output)
        }


@dataclass
class ServingHost:
    """The provisioned container, its inventory and the run that provisioned it."""

    name: str
    inventory: Path
    stack_name: str
    first_run: PlaybookRun
    timings: dict[str, float] = field(default_factory=dict)

    def sh(self, script: str, user: str = "root", timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a bash script on the host (as `user`)."""
        return subprocess.run(
            ["docker", "exec", "--user", user, self.name, "bash", "-c", script],
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def playbook(self, *args: str, extra_vars: dict | None = None, playbook: str = "site.yml") -> PlaybookRun:
        return run_playbook(self.inventory, playbook, list(args), extra_vars)


def run_playbook(inventory: Path, playbook: str, args: list[str], extra_vars: dict | None = None) -> PlaybookRun:
    cmd = [str(Path(sys.prefix) / "bin" / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / playbook)]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    started = time.monotonic()
    result = subprocess.run([*cmd, *args], text=True, capture_output=True, env=env, cwd=ROOT, timeout=1500, check=False)
    return PlaybookRun(result.returncode, result.stdout + result.stderr, time.monotonic() - started)


def serving_group_vars(stack_name: str) -> dict:
    return {
        "stack_name": stack_name,
        "stack_serving_enabled": True,
        # NVIDIA's files have no publisher checksum; this run installs none of them (only the
        # preflight sees them), so stand-ins satisfy its check of their form.
        "stack_artifact_checksums": {name: "ab" * 32 for name in unpinned_files(CATALOG)},
        "stack_artifact_cache_dir": str(ARTIFACT_CACHE),
    }


# The tags that install MindSpore Serving on a host without the NVIDIA stack.
PROVISION_TAGS = "preflight,mindspore,serving"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "removes_serving: removes Serving from serving_host; runs after the others")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("removes_serving") is not None)


@pytest.fixture(scope="session")
def serving_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingHost]:
    """A fresh container with MindSpore and Serving installed by site.yml (provisioned once)."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        sandbox.start_host(HOST_NAME, "focal")
        timings["container"] = time.monotonic() - started
        inventory = sandbox.write_inventory(
            tmp_path_factory.mktemp("serving") / "inventory.yml", [HOST_NAME], serving_group_vars(STACK_NAME)
        )
        run = run_playbook(inventory, "site.yml", ["--tags", PROVISION_TAGS])
        timings["provision"] = run.seconds
        print(f"serving_host: {STACK_NAME} on {HOST_NAME}: site.yml {PROVISION_TAGS} {run.seconds:.1f} s")
        yield ServingHost(HOST_NAME, inventory, STACK_NAME, run, timings)
    finally:
        print("serving_host timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        if os.environ.get("MSGPU_KEEP_SERVING_HOST") != "1":
            sandbox.stop_host(HOST_NAME)
