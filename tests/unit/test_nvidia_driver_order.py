"""The nvidia_driver role runs the handlers its changes notified (the initramfs update a changed nouveau
blacklist needs, systemd's daemon-reload for the persistenced drop-in) before it reboots the host: handlers
otherwise wait for the end of the play, and the host would boot with an initramfs that still loads nouveau.
Read from the role's task file as Ansible runs it (top-level tasks in order)."""

from __future__ import annotations

import yaml

from tests.conftest import ROOT

PRESENT = ROOT / "roles" / "nvidia_driver" / "tasks" / "present.yml"


def _position(tasks: list[dict], match) -> int:
    found = [i for i, task in enumerate(tasks) if match(task)]
    assert len(found) == 1, f"expected one such task in {PRESENT}, found {len(found)}"
    return found[0]


def test_handlers_are_flushed_after_the_files_and_before_the_reboot():
    tasks = yaml.safe_load(PRESENT.read_text())
    files = _position(tasks, lambda t: t.get("ansible.builtin.include_role", {}).get("tasks_from") == "paths")
    flush = _position(tasks, lambda t: t.get("ansible.builtin.meta") == "flush_handlers")
    reboot = _position(tasks, lambda t: "ansible.builtin.reboot" in t)
    assert files < flush < reboot
    notified = [entry for entry in ("Update the initramfs", "Reload the systemd units") if entry in PRESENT.read_text()]
    assert notified == ["Update the initramfs", "Reload the systemd units"]
