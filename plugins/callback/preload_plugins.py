"""Load each task's plugins in ansible-playbook's own process before its workers start.

Ansible runs every task on every host in a new worker process, forked from ansible-playbook. A worker that
finds a plugin (the task's action and module, the connection, shell and become plugins, lookups) not yet
loaded imports it and parses the YAML documentation of its options, and it does so again in the next
worker: nothing a worker loads comes back to the parent. Loaded in the parent once, every later fork
inherits them. On this project's idempotent re-run (site.yml, the NVIDIA parts and OpenMPI, 4 sandbox
hosts) that took about a quarter of the controller's CPU; see docs/testing.md ("Fleet re-run").

It changes nothing a task does: it finds the same plugins the worker would (the worker's own rules,
ansible/executor/task_executor.py, _get_action_handler_with_module_context) and only loads them earlier.
A plugin it cannot find or load is left to the worker, which reports it as it always has.
"""

from __future__ import annotations

import contextlib

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import (
    action_loader,
    become_loader,
    connection_loader,
    lookup_loader,
    module_loader,
    shell_loader,
)

DOCUMENTATION = """
name: preload_plugins
type: aggregate
short_description: Load each task's plugins once in the controller process, before its workers fork
description:
  - Loads the action plugin and module of each task when the task starts, and the connection, shell, become
    and lookup plugins this project uses when the run starts, in ansible-playbook's own process, so that the
    worker processes forked for every task and host inherit them instead of loading them again.
  - Changes no task's behaviour.
requirements:
  - enabled in callbacks_enabled (the project's ansible.cfg)
"""

# Loaded when the run starts: what workers load on every host and task, whatever the task. The connection
# plugins are SSH (real servers), local (the controller's own plays) and Docker (the test bed's hosts).
_AT_START = (
    (connection_loader, ("ansible.builtin.ssh", "ansible.builtin.local", "community.docker.docker")),
    (shell_loader, ("ansible.builtin.sh",)),
    (become_loader, ("ansible.builtin.sudo", "ansible.builtin.su")),
    # The lookups the roles and playbooks call (grep "lookup('" and "query('").
    (lookup_loader, ("ansible.builtin.file", "ansible.builtin.vars", "ansible.builtin.varnames",
                     "ansible.builtin.template", "ansible.builtin.env", "ansible.builtin.inventory_hostnames",
                     "ansible.builtin.fileglob")),
)  # fmt: skip


def _load(loader, name: str, collections=None) -> None:
    # A plugin that does not load here is loaded again by the worker, which reports what is wrong.
    with contextlib.suppress(Exception):
        loader.get(name, class_only=True, collection_list=collections)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "preload_plugins"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._seen: set[tuple[str, tuple[str, ...]]] = set()

    def v2_playbook_on_start(self, playbook):
        for loader, names in _AT_START:
            for name in names:
                _load(loader, name)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._preload(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._preload(task)

    def _preload(self, task) -> None:
        action = getattr(task, "action", None)
        collections = list(getattr(task, "collections", None) or [])
        key = (str(action), tuple(collections))
        if not action or key in self._seen:
            return
        self._seen.add(key)
        try:
            module = module_loader.find_plugin_with_context(action, collection_list=collections)
            if module.resolved and module.action_plugin:
                handler = module.action_plugin
            elif action_loader.has_plugin(action, collection_list=collections):
                handler = action
            else:
                handler, collections = "ansible.legacy.normal", None
        except Exception:  # as above: the worker's own lookup reports it
            return
        _load(action_loader, handler, collections)
