"""The design card's commands, as typed from the repository root.

`ansible-playbook -i inventory/mysite/hosts.yml site.yml` needs the root's site.yml (which imports
playbooks/site.yml) and the project's ansible.cfg (roles_path), found because the command runs in the
root. `invoke verify` / `invoke provision` need only the virtualenv's bin on PATH (`. .venv/bin/activate`):
invoke finds tasks.py from the root or any folder below it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

VENV_BIN = Path(sys.prefix) / "bin"


def typed(command: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`command` as a user types it after `. .venv/bin/activate`: found on PATH, no ANSIBLE_CONFIG."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", VIRTUAL_ENV=sys.prefix)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_site_yml_at_the_root_passes_the_syntax_check():
    run = typed(["ansible-playbook", "-i", "inventory/example/hosts.yml", "site.yml", "--syntax-check"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "playbook: site.yml" in run.stdout


def test_site_yml_at_the_root_is_playbooks_site_yml():
    """The same plays and tasks in the same order (tag sets may list their tags in any order)."""

    def plan(playbook: str) -> list[str]:
        run = typed(["ansible-playbook", "-i", "inventory/example/hosts.yml", playbook, "--list-tasks"])
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        lines = [line.strip() for line in run.stdout.splitlines()[2:] if line.strip()]
        return [
            re.sub(r"TAGS: \[(.*)\]", lambda m: "TAGS: " + ",".join(sorted(m.group(1).split(","))), line)
            for line in lines
        ]

    root = plan("site.yml")
    assert root == plan("playbooks/site.yml")
    plays = [line for line in root if line.startswith("play #")]
    assert "Check the inventory" in plays[0] and "Summarise the fleet" in plays[-1], plays


def test_invoke_lists_the_tasks_from_the_root_and_below():
    for cwd in (ROOT, ROOT / "roles" / "verify"):
        run = typed(["invoke", "--list"], cwd=cwd)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        listed = {line.split()[0] for line in run.stdout.splitlines()[1:] if line.startswith("  ") and line.split()}
        assert {"verify", "provision", "bench", "test", "fetch"} <= listed, run.stdout


def test_invoke_verify_and_provision_take_an_inventory():
    for name in ("verify", "provision"):
        run = typed(["invoke", "--help", name])
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "--inventory" in run.stdout and "--limit" in run.stdout, run.stdout
