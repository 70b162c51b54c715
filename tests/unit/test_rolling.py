"""Rolling runs are Ansible's own (stack_serial; ./toolkit provision --batch N): every play of site.yml that
changes hosts carries the same serial and max_fail_percentage, OpenMPI's fleet-wide play only the latter,
and no play templates any_errors_fatal (Ansible reads that keyword's text, so a template is always true).
The keywords are then run as written, by ansible-playbook on three local hosts: in batches the first
failed host stops the run; without stack_serial the other hosts finish. The fleet tests do the same on
real containers with the real playbooks (tests/fleet/test_fleet.py::test_rolling_*)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"
SERIAL = "{{ stack_serial | default(0) | int }}"
MAX_FAIL = "{{ 0 if (stack_serial | default(0) | int) > 0 else 100 }}"
# The plays of site.yml that only read (preflight, the summary) or touch the whole fleet at once.
FLEET_WIDE = {"OpenMPI"}


def site_plays() -> list[dict]:
    out = []
    for entry in yaml.safe_load((PLAYBOOKS / "site.yml").read_text()):
        out += yaml.safe_load((PLAYBOOKS / entry["ansible.builtin.import_playbook"]).read_text())
    return out


def test_every_play_that_changes_hosts_goes_in_batches():
    changing = [play for play in site_plays() if play.get("become")]
    assert {play["name"] for play in changing} >= {"NVIDIA driver", "CUDA toolkits", "MindSpore virtualenv", "OpenMPI"}
    for play in changing:
        assert play.get("max_fail_percentage") == MAX_FAIL, play["name"]
        assert play.get("serial") == (None if play["name"] in FLEET_WIDE else SERIAL), play["name"]
    validate = [play for play in site_plays() if play["name"] == "Validate the configuration against the stack catalog"]
    assert validate and validate[0]["serial"] == SERIAL  # where the stack_serial check sees the batch


@pytest.mark.parametrize("path", sorted(PLAYBOOKS.glob("*.yml")), ids=lambda p: p.name)
def test_no_play_templates_any_errors_fatal(path):
    for play in yaml.safe_load(path.read_text()) or []:
        assert play.get("any_errors_fatal", False) in (True, False), (path.name, play.get("name"))


LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
# A host that cannot be reached: SSH to a closed port on the loopback (refused at once).
DOWN = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_pipelining": False}


def ansible(
    tmp_path: Path, playbook: Path, group_vars: dict, extra: list[str], hosts: dict | None = None
) -> subprocess.CompletedProcess:
    """ansible-playbook with the project's ansible.cfg on `hosts` (three local hosts h1..h3) in gpu_servers."""
    group = {"hosts": hosts or {h: LOCAL for h in ("h1", "h2", "h3")}, "vars": group_vars}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_servers": group}}}))
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook), *extra]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def run(tmp_path: Path, serial: int, fail: str) -> tuple[int, list[tuple[str, list[str]]]]:
    """Two plays with site.yml's keywords; `fail` fails in the first. Returns the exit status and, per play
    started, the hosts it ran on."""
    play = {"hosts": "gpu_servers", "gather_facts": False, "serial": SERIAL, "max_fail_percentage": MAX_FAIL}
    step = {"name": "step", "ansible.builtin.debug": {"msg": "ran"}}
    broken = {"name": "break", "ansible.builtin.fail": {"msg": "broken"}, "when": f"inventory_hostname == '{fail}'"}
    playbook = tmp_path / "site.yml"
    playbook.write_text(
        yaml.safe_dump([{**play, "name": "one", "tasks": [step, broken]}, {**play, "name": "two", "tasks": [step]}])
    )
    result = ansible(tmp_path, playbook, {}, ["-e", f"stack_serial={serial}"] if serial else [])
    parts = re.split(r"^PLAY \[(.+?)\] \**$", result.stdout, flags=re.M)
    started = [
        (name, sorted(set(re.findall(r"^ok: \[(h\d)\]", body, re.M)))) for name, body in zip(parts[1::2], parts[2::2])
    ]
    return result.returncode, started


def test_in_batches_the_first_failed_host_stops_the_run(tmp_path):
    rc, started = run(tmp_path, serial=2, fail="h1")
    assert rc != 0
    assert started == [("one", ["h1", "h2"])], started  # neither h3 nor the second play


def test_batches_follow_the_inventory(tmp_path):
    rc, started = run(tmp_path, serial=2, fail="")
    assert rc == 0
    assert started == [("one", ["h1", "h2"]), ("one", ["h3"]), ("two", ["h1", "h2"]), ("two", ["h3"])], started


def test_without_batches_a_failed_host_drops_out_and_the_others_finish(tmp_path):
    rc, started = run(tmp_path, serial=0, fail="h1")
    assert rc != 0
    assert started == [("one", ["h1", "h2", "h3"]), ("two", ["h2", "h3"])], started


@pytest.mark.parametrize("where", ["group_vars", "command line"])
def test_stack_serial_in_the_inventory_is_refused_before_any_host_is_touched(tmp_path, where):
    """Ansible sizes a play's batches before it reads the inventory: stack_serial in group_vars would be
    ignored, so the preflight's first (controller-side) play refuses it by name; given with -e it passes
    that play (the run then goes on to the host checks, which connect to the hosts)."""
    group_vars = {"stack_serial": 2} if where == "group_vars" else {}
    extra = ["-e", "stack_serial=2"] if where == "command line" else []
    result = ansible(tmp_path, PLAYBOOKS / "preflight.yml", group_vars, extra)
    flat = " ".join(result.stdout.split())
    refused = "stack_serial: 2 is set where Ansible cannot use it for batches"
    if where == "group_vars":
        assert result.returncode != 0 and refused in flat, flat[-3000:]
        assert "PLAY [Check each host" not in result.stdout  # the run ends in the controller-side play
    else:
        assert refused not in flat, flat[-3000:]
        assert re.search(r"^ok: \[h1\]", result.stdout.split("PLAY [Check each host")[1], re.M), flat[-3000:]


def pinged(output: str) -> list[str]:
    """The hosts the play's own task (step, a ping) reached."""
    steps = [part for part in output.split("TASK [") if part.startswith("step]")]
    return sorted(host for part in steps for host in re.findall(r"^ok: \[(h\d)\]$", part, re.M))


def test_a_host_lost_in_an_earlier_batch_stops_a_rolling_run(tmp_path):
    """max_fail_percentage counts failed hosts, not unreachable ones: the component plays' first step
    (roles/stack/tasks/play.yml) stops a rolling run when a host was lost earlier in it. Two hosts at a
    time: in the first batch h1 finishes and h9 cannot be reached, and the play goes no further (h2 never
    starts). (Ansible itself stops only when a whole batch is lost.)"""
    play = {
        "name": "component",
        "hosts": "gpu_servers",
        "gather_facts": False,
        "serial": SERIAL,
        "max_fail_percentage": MAX_FAIL,
        "pre_tasks": [
            {
                "name": "Prepare the play",
                "ansible.builtin.include_role": {"name": "stack", "tasks_from": "play"},
                "vars": {"stack_play_components": []},
                "when": "not stack_play_ready | default(false)",
            }
        ],
        "tasks": [{"name": "step", "ansible.builtin.ping": {}}],
    }
    playbook = tmp_path / "component.yml"
    playbook.write_text(yaml.safe_dump([play]))
    # What site.yml's preflight leaves: the host checked, the cache filled, dpkg checked.
    done = {"stack_host": {}, "artifacts_cache_done": True, "host_utils_dpkg_checked": True}
    hosts = {"h1": LOCAL, "h9": DOWN, "h2": LOCAL}
    result = ansible(tmp_path, playbook, done, ["-e", "stack_serial=2"], hosts)
    flat = " ".join(result.stdout.split())
    assert result.returncode != 0, flat[-3000:]
    assert "Rolling run (stack_serial 2): h9 failed or could not be reached earlier in this run" in flat, flat[-3000:]
    assert pinged(result.stdout) == ["h1"], flat[-3000:]
    # Without batches the unreachable host drops out and the others go on.
    result = ansible(tmp_path, playbook, done, [], hosts)
    assert result.returncode != 0 and "Rolling run" not in result.stdout
    assert pinged(result.stdout) == ["h1", "h2"], result.stdout[-3000:]
