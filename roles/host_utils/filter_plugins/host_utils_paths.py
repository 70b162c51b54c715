"""A role's own small files, folders and links (roles/host_utils/tasks/paths.yml): the `host_utils_paths_wanted` filter
gives files/paths_state.py what it compares (each file's sha1 instead of its content), `host_utils_paths_todo` the
entries it found different, `host_utils_paths_absent` removal entries for a list of paths (a role's uninstall).
Standard library only, like stack_catalog.py.

An entry: ``{"path", "state": "file" | "directory" | "link" | "absent", "content" (file), "src" (link),
"owner", "group", "mode"}``; owner, group and mode are optional (as for Ansible's file module).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

STATES = ("file", "directory", "link", "absent")
ATTRIBUTES = ("owner", "group", "mode")


def _check(entry: Any) -> None:
    if not isinstance(entry, dict) or not entry.get("path"):
        raise ValueError(f"host_utils_paths: an entry needs a path: {entry!r}")
    state = entry.get("state")
    if state not in STATES:
        raise ValueError(f"host_utils_paths: {entry['path']}: state {state!r} is not one of {', '.join(STATES)}")
    if state == "file" and not isinstance(entry.get("content"), str):
        raise ValueError(f"host_utils_paths: {entry['path']}: a file needs its content (a string)")
    if state == "link" and not entry.get("src"):
        raise ValueError(f"host_utils_paths: {entry['path']}: a link needs its src")


def paths_wanted(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What paths_state.py compares: path, state, src, the attributes given, and a file's sha1 (of the bytes
    Ansible's copy module writes for `content`: its UTF-8 encoding)."""
    wanted = []
    for entry in entries:
        _check(entry)
        item = {"path": str(entry["path"]), "state": entry["state"]}
        item.update({key: str(entry[key]) for key in ATTRIBUTES if entry.get(key) not in (None, "")})
        if entry["state"] == "file":
            item["sha1"] = hashlib.sha1(entry["content"].encode("utf-8")).hexdigest()
        if entry["state"] == "link":
            item["src"] = str(entry["src"])
        wanted.append(item)
    return wanted


def paths_todo(entries: list[dict[str, Any]], state: Any, kind: str = "") -> list[dict[str, Any]]:
    """The entries (of state `kind`, or all) whose path paths_state.py reported as different. `state`: its
    registered result, or its output parsed."""
    if isinstance(state, dict) and "stdout" in state:
        state = json.loads(state["stdout"])
    differ = {str(path) for path in state}
    return [entry for entry in entries if (not kind or entry["state"] == kind) and str(entry["path"]) in differ]


def paths_absent(paths: list[Any]) -> list[dict[str, Any]]:
    """Entries that remove each path, in the given order, each path once (empty ones left out): a role's
    uninstall as one read of everything it may have left (its markers first)."""
    entries, seen = [], set()
    for path in paths:
        if path in (None, "") or str(path) in seen:
            continue
        seen.add(str(path))
        entries.append({"path": str(path), "state": "absent"})
    return entries


class FilterModule:
    """Ansible filter plugin entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "host_utils_paths_wanted": paths_wanted,
            "host_utils_paths_todo": paths_todo,
            "host_utils_paths_absent": paths_absent,
        }
