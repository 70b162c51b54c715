"""Fleet tests: four Ubuntu 20.04 containers on their own Docker network (testbed/fleet.py), the NVIDIA
fixtures on a loopback mirror that counts every request (standing in for NVIDIA's servers), and a fresh
controller-side artifact cache. The hosts cannot reach the mirror (it is on the controller's loopback):
everything NVIDIA's comes to them through the controller's cache, as at a site with one internet-facing
controller. The containers are created once per session; tests run in file order and build on each other.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from testbed import fixtures, mirror, sandbox, scenarios  # noqa: E402
from testbed import fleet as fleet_bed  # noqa: E402

# Container names (MSGPU_FLEET_PREFIX lets two sessions on one machine keep out of each other's way).
PREFIX = os.environ.get("MSGPU_FLEET_PREFIX", "msgpu-fleet")
NAMES = [f"{PREFIX}-{n}" for n in range(1, 5)]
RECAP = re.compile(rf"^({re.escape(PREFIX)}-\d+)\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class PlaybookRun:
    rc: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        """host -> {changed, unreachable, failed} from the PLAY RECAP."""
        return {
            host: {"changed": int(changed), "unreachable": int(unreachable), "failed": int(failed)}
            for host, changed, unreachable, failed in RECAP.findall(self.output)
        }


@dataclass
class Fleet:
    hosts: list[str]
    served: mirror.Mirror
    cache: Path
    group_vars: dict
    folder: Path
    stopped: set[str] = field(default_factory=set)

    def inventory(self, hosts: list[str] | None = None, host_vars: dict | None = None, **extra_vars) -> Path:
        chosen = hosts or self.hosts
        key = abs(hash((tuple(chosen), repr(extra_vars), repr(host_vars))))
        path = self.folder / f"inventory-{len(chosen)}-{key}.yml"
        return sandbox.write_inventory(path, chosen, {**self.group_vars, **extra_vars}, host_vars, down=self.stopped)

    def playbook(
        self, playbook: str, inventory: Path, extra_vars: dict | None = None, args: list[str] | None = None
    ) -> PlaybookRun:
        cmd = [
            str(Path(sys.prefix) / "bin" / "ansible-playbook"),
            "-i",
            str(inventory),
            str(ROOT / "playbooks" / playbook),
        ]
        if extra_vars:
            cmd += ["-e", json.dumps(extra_vars)]
        cmd += args or []
        return self.run(cmd)

    def run(self, cmd: list[str], timeout: int = 2400) -> PlaybookRun:
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
        started = __import__("time").monotonic()
        result = subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=ROOT, timeout=timeout)
        return PlaybookRun(result.returncode, result.stdout + result.stderr, __import__("time").monotonic() - started)

    def sh(self, host: str, script: str) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "exec", host, "bash", "-c", script], text=True, capture_output=True)

    def stop(self, host: str) -> None:
        """Make a host unreachable: its container stops (as a server that lost power)."""
        subprocess.run(["docker", "stop", "-t", "1", host], check=True, capture_output=True)
        self.stopped.add(host)

    def start(self, host: str) -> None:
        subprocess.run(["docker", "start", host], check=True, capture_output=True)
        self.stopped.discard(host)

    @property
    def reachable(self) -> list[str]:
        return [h for h in self.hosts if h not in self.stopped]


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = fixtures.build_mirror()
    cache = sandbox.CACHE / f"{PREFIX}-artifact-cache"
    shutil.rmtree(cache, ignore_errors=True)
    fleet_bed.start(NAMES)
    try:
        with mirror.serving(root) as served:
            group_vars = {
                **scenarios.sandbox_group_vars(root, fixtures.inventory_vars(root, served.base_url)),
                "stack_artifact_cache_dir": str(cache),
            }
            yield Fleet(NAMES, served, cache, group_vars, tmp_path_factory.mktemp("fleet"))
    finally:
        fleet_bed.stop(NAMES)
        # Rebuilt by the next run anyway; the later stages need the disk space.
        shutil.rmtree(cache, ignore_errors=True)
