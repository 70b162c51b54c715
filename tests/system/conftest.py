"""System tests share one provisioned host (MSGPU_VERIFY_INVENTORY, set by ./toolkit test): the module
that changes the driver branch runs second to last, the one that uninstalls the stack last. The helpers
below are the ones both of those modules use on that host."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
# One host's line of Ansible's PLAY RECAP: host, changed, unreachable, failed.
RECAP = re.compile(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# Any branch's driver packages (the stack's, or the one a branch change left).
BRANCH_PACKAGE = re.compile(
    r"^((lib)?nvidia-[a-z0-9-]*?-([0-9]{3})(-.*)?|cuda-drivers(-fabricmanager)?-([0-9]{3})"
    r"|linux-(modules|objects)-nvidia-([0-9]{3})-.*)$"
)

# Last, in this order: the driver branch change (the host then has another branch than the stack's),
# then the uninstall (it removes what every other module uses).
LAST = ("test_driver_upgrade.py", "test_uninstall.py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: LAST.index(item.path.name) + 1 if item.path.name in LAST else 0)


@pytest.fixture(scope="module")
def inventory() -> Path:
    """The inventory of the provisioned sandbox host (molecule default's, kept for these tests)."""
    value = os.environ.get("MSGPU_VERIFY_INVENTORY", "")
    if not value or not Path(value).is_file():
        pytest.fail(
            "MSGPU_VERIFY_INVENTORY must name the inventory of a provisioned sandbox host (set by ./toolkit test)"
        )
    return Path(value)


@pytest.fixture(scope="module")
def host(inventory: Path) -> str:
    """The one host of that inventory (its container name)."""
    hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_servers"]["hosts"]
    assert len(hosts) == 1, hosts
    return next(iter(hosts))


def on_host(host: str, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A bash script run as root in the host's container."""
    return subprocess.run(
        ["docker", "exec", host, "bash", "-c", script], capture_output=True, text=True, timeout=timeout, check=False
    )


def recap(proc: subprocess.CompletedProcess) -> dict[str, tuple[int, int, int]]:
    """host -> (changed, unreachable, failed) from a playbook run's recap."""
    return {h: (int(c), int(u), int(f)) for h, c, u, f in RECAP.findall(proc.stdout)}


def playbook(inventory: Path, extra_vars: dict, tags: str = "") -> tuple[subprocess.CompletedProcess, float]:
    """site.yml with these extra vars (and tags) on the inventory's host; the run and its wall time."""
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }
    args = ["ansible-playbook", "-i", str(inventory), "site.yml", "-e", json.dumps(extra_vars)]
    args += ["--tags", tags] if tags else []
    started = time.monotonic()
    # Generous: a branch change builds DKMS modules for every kernel (over 30 min on a slow, shared machine).
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    return proc, time.monotonic() - started


def changed(proc: subprocess.CompletedProcess, host: str) -> int:
    """The run's changed count for the host, once it is known to have succeeded there."""
    rows = recap(proc)
    assert proc.returncode == 0 and host in rows, proc.stdout[-5000:] + proc.stderr[-2000:]
    count, unreachable, failed = rows[host]
    assert unreachable == 0 and failed == 0, proc.stdout[-5000:]
    return count


def uninstall(inventory: Path, *options: str) -> tuple[subprocess.CompletedProcess, float]:
    """`./toolkit uninstall -i <inventory> [options]` as a user types it; the run and its wall time."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "toolkit"), "uninstall", "-i", str(inventory), *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    return proc, time.monotonic() - started
