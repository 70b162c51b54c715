"""What the tasks share: running a step from the project root, the ansible-playbook command line, the
target inventory, the verify report's summary."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from invoke import Context, Exit

from cli import local

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.prefix) / "bin"
RESULTS = ROOT / "artifacts"


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for every tool: the venv first on PATH, the project's ansible.cfg."""
    merged = {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": os.environ.get("ANSIBLE_FORCE_COLOR", "0"),
        "PY_COLORS": os.environ.get("PY_COLORS", "0"),
    }
    merged.update(extra or {})
    return merged


def _free_gib() -> str:
    return f"{shutil.disk_usage(ROOT).free / 2**30:.1f}"


def run(c: Context, cmd: str, env_vars: dict[str, str] | None = None, what: str = "") -> float:
    """Run `cmd` from the project root; raise Exit naming the step when it fails. Returns seconds."""
    started = time.monotonic()
    # Free disk at each step: the sandbox hosts and caches take tens of GB, and a CI machine's free
    # space varies; a step that runs out says so here.
    print(f"\n==> {what or cmd} [{_free_gib()} GiB free]", flush=True)
    with c.cd(str(ROOT)):
        result = c.run(cmd, env=env(env_vars), warn=True, pty=False)
    elapsed = time.monotonic() - started
    if result is None or not result.ok:
        raise Exit(
            f"FAILED: {what or cmd} (exit {getattr(result, 'exited', '?')}, {elapsed:.0f} s, {_free_gib()} GiB free)",
            code=1,
        )
    print(f"<== {what or cmd}: ok in {elapsed:.0f} s [{_free_gib()} GiB free]", flush=True)
    return elapsed


def timed(action) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def command(args: list[str], extra: str = "") -> str:
    """A shell command line: `args` quoted, then the user's `extra` arguments as typed."""
    return " ".join(shlex.quote(a) for a in args) + (f" {extra}" if extra else "")


def playbook_args(playbook: str, inventory: str, limit: str, extra_vars: dict, extra: str) -> str:
    args = ["ansible-playbook", "-i", inventory, playbook, "-e", json.dumps(extra_vars)]
    if limit:
        args += ["--limit", limit]
    return command(args, extra)


def user_inventory(inventory: str) -> str:
    """The user's inventory as an absolute path (the commands run in the project root, invoke itself may
    run in any folder below it)."""
    if not Path(inventory).exists():
        raise Exit(f"--inventory: '{inventory}' does not exist (copy inventory/example to start one)", code=2)
    return str(Path(inventory).resolve())


def target_inventory(inventory: str) -> str:
    """The user's inventory, or the local sandbox host (which must have been provisioned)."""
    if inventory:
        return user_inventory(inventory)
    return local.sandbox_inventory()


def print_summary(folder: Path) -> dict:
    summary_file = folder / "summary.json"
    if not summary_file.exists():
        raise Exit(f"no report in {folder}: the verify playbook did not get to write it", code=1)
    summary = json.loads(summary_file.read_text())
    # The fleet comparison: hosts that failed or are slow against the fleet's median, and the
    # data-parallel and MPI checks across hosts.
    fleet = summary.get("fleet") or {}
    for entry in fleet.get("table", []):
        if entry["status"] != "OK":
            print(f"{entry['status']} {entry['host']}: {entry['reason']}")
    if fleet.get("distributed"):
        print(f"data-parallel: {fleet['distributed']['verdict']} {fleet['distributed'].get('explanation') or ''}")
    print(f"\nReport: {folder / 'report.html'} and report.md; per-host JSON in {folder / 'hosts'}")
    return summary
