"""plugins/callback/preload_plugins.py: each task's plugins are loaded in ansible-playbook's own process (so that
the workers it forks inherit them), and a run with it enabled, as the project's ansible.cfg has it, works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "callback" / "preload_plugins.py"

# Run in a fresh interpreter: this test process may have loaded plugins already.
PROBE = textwrap.dedent(
    """
    import importlib.util, json, sys
    from types import SimpleNamespace
    from ansible import constants as C
    from ansible.plugins.loader import action_loader, init_plugin_loader

    init_plugin_loader()
    spec = importlib.util.spec_from_file_location("preload_plugins", sys.argv[1])
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    callback = plugin.CallbackModule()

    def loaded(name):
        return any(path.endswith("/plugins/action/" + name + ".py") for path in action_loader._module_cache)

    def options_read(kind, name):
        # What a worker would otherwise parse again: the plugin's option definitions (its DOCUMENTATION).
        return any(key.endswith(".plugins." + kind + "." + name) for key in C.config._plugins.get(kind, {}))

    out = {"before": {"ssh": options_read("connection", "ssh"),
                      "command": loaded("command"), "normal": loaded("normal")}}
    callback.v2_playbook_on_start(None)
    out["ssh_after_start"] = options_read("connection", "ssh")
    out["sudo_after_start"] = options_read("become", "sudo")
    # A module with its own action plugin, then one run by the 'normal' action, then a name that resolves to nothing.
    callback.v2_playbook_on_task_start(SimpleNamespace(action="ansible.builtin.command", collections=[]), False)
    out["command_after_task"] = loaded("command")
    out["normal_before_apt"] = loaded("normal")
    callback.v2_playbook_on_task_start(SimpleNamespace(action="ansible.builtin.apt", collections=[]), False)
    out["normal_after_apt"] = loaded("normal")
    callback.v2_playbook_on_task_start(SimpleNamespace(action="no.such.module", collections=[]), False)
    print(json.dumps(out))
    """
)


def test_each_tasks_plugins_are_loaded_in_the_controller_process():
    result = subprocess.run([sys.executable, "-c", PROBE, str(PLUGIN)], capture_output=True, text=True, check=True)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["before"] == {"ssh": False, "command": False, "normal": False}
    assert out["ssh_after_start"] and out["sudo_after_start"]
    assert out["command_after_task"]
    assert not out["normal_before_apt"] and out["normal_after_apt"]


def test_a_run_with_the_projects_ansible_cfg_enables_it_and_its_tasks_behave(tmp_path):
    """ansible-playbook with the project's ansible.cfg: the callback is found and enabled (a missing callback
    plugin is only a warning, so the test asks Ansible for it), and tasks run with it as without it."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        json.dumps(
            [
                {
                    "name": "Probe",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {"name": "Run a command", "ansible.builtin.command": "echo preloaded", "register": "out",
                         "changed_when": False},
                        {"name": "Check its output", "ansible.builtin.assert": {"that": "out.stdout == 'preloaded'"}},
                        {"name": "Template a value", "ansible.builtin.set_fact": {"x": "{{ 20 + 22 }}"}},
                        {"name": "Check it", "ansible.builtin.assert": {"that": "x | int == 42"}},
                    ],
                }
            ]
        )
    )  # fmt: skip
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    bin_dir = Path(sys.executable).parent
    config = subprocess.run(
        [str(bin_dir / "ansible-config"), "dump", "--only-changed", "--format", "json"],
        capture_output=True, text=True, env=env, cwd=ROOT, check=True,
    )  # fmt: skip
    settings = {item["name"]: item["value"] for item in json.loads(config.stdout) if "name" in item}
    assert "preload_plugins" in settings["CALLBACKS_ENABLED"]
    assert any(Path(p, "preload_plugins.py").is_file() for p in settings["DEFAULT_CALLBACK_PLUGIN_PATH"])
    # As configured (with it), then without it.
    for run_env in (env, dict(env, ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_roles")):
        result = subprocess.run(
            [str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
             "-e", f"ansible_python_interpreter={sys.executable}"],
            capture_output=True, text=True, env=run_env, cwd=ROOT,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ok=4" in result.stdout and "failed=0" in result.stdout
        assert "preload_plugins" not in result.stderr, result.stderr  # no warning about it
