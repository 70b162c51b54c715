"""The design card's commands, as typed from the repository root.

`ansible-playbook -i inventory/mysite/hosts.yml site.yml` needs the root's site.yml (which imports
playbooks/site.yml) and the project's ansible.cfg (roles_path), found because the command runs in the
root. `invoke verify` / `invoke provision` need only the virtualenv's bin on PATH (`. .venv/bin/activate`):
invoke finds tasks.py from the root or any folder below it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


# --- a thin CLI: listing the tasks, or running a real fleet's, loads neither the test bed nor the catalog ---
# Run in a fresh interpreter: records every module of testbed/ it imports and every file it opens of the
# catalog (catalog/stacks.yml) and the resolver that reads it (an audit hook sees each open, however made).
WATCH = r"""
import json, sys
watched = ("catalog/stacks.yml", "filter_plugins/stack_catalog.py")
opened = []
sys.addaudithook(lambda event, args: event == "open" and str(args[0]).endswith(watched) and opened.append(str(args[0])))


def report(**extra):
    testbed = sorted(name for name in sys.modules if name.split(".")[0] == "testbed")
    print("WATCH " + json.dumps({"testbed": testbed, "opened": opened, **extra}))
"""


def watched(code: str, *args: str, cwd: Path = ROOT) -> tuple[dict, str]:
    run = subprocess.run(
        [sys.executable, "-c", WATCH + code, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("WATCH "))
    return json.loads(line[len("WATCH ") :]), run.stdout


@pytest.mark.parametrize(
    ("argv", "shown"),
    [(["--list"], "gpu-smoke"), (["--help", "provision"], "--batch"), (["test", "--help"], "runfile")],
)
def test_listing_the_tasks_loads_neither_the_test_bed_nor_the_catalog(argv, shown):
    """What `invoke --list` (and a task's --help) does: find tasks.py, import it, build the collection."""
    code = f"""
from invoke.main import program
program.run(["invoke", *{argv!r}], exit=False)
report()
"""
    seen, output = watched(code, cwd=ROOT / "roles" / "verify")
    assert shown in output
    assert seen["testbed"] == [] and seen["opened"] == [], seen


def test_a_real_fleets_commands_never_load_the_test_bed(tmp_path):
    """Every operator command given an inventory, its commands recorded instead of run."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    gpu_servers:\n      hosts:\n        gpu01:\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"fleet": {}, "hosts": []}))
    code = r"""
sys.path.insert(0, ".")
from invoke import Context
from invoke.runners import Result

import tasks

ran = []


class Recording(Context):
    def run(self, command, **kwargs):
        ran.append(command)
        return Result(command=command, exited=0)


inventory, out = sys.argv[1:]
calls = {
    "provision": {"check": True, "limit": "gpu01", "extra": "-e stack_cudnn_method=wheel"},
    "uninstall": {"component": "cuda"},
    "verify": {"out": out, "quick": True},
    "gpu-smoke": {"out": out},
    "bench": {"out": out, "device": "CPU"},
    "doctor": {"out": out},
    "fetch": {"cache": out + "/cache"},
}
for name, options in calls.items():
    tasks.ns[name](Recording(), inventory=inventory, **options)
report(ran=ran)
"""
    seen, _ = watched(code, str(inventory), str(out))
    assert seen["testbed"] == [] and seen["opened"] == [], seen
    ran = seen["ran"]
    assert ran[0] == (
        f"ansible-playbook -i {inventory} playbooks/site.yml --limit gpu01 --check --diff -e stack_cudnn_method=wheel"
    )
    playbooks = [command.split()[3] for command in ran]
    assert playbooks == [f"playbooks/{name}.yml" for name in ("site", "site", "verify", "gpu_smoke", "verify")] + [
        "playbooks/doctor.yml",
        "playbooks/fetch.yml",
    ], ran
    assert all(f"-i {inventory} " in command for command in ran), ran


def test_the_cli_names_the_test_beds_scenarios():
    """`./toolkit test --scenario` names the scenarios without loading the test bed: the same, in order."""
    from cli import checks
    from testbed import scenarios

    assert checks.SCENARIO_NAMES == tuple(scenarios.SCENARIOS) == tuple(scenarios.SCENARIO_VARS)
