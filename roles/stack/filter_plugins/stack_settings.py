"""What each role declares about its own settings (roles/<role>/meta/settings.yml: the kind of each setting, its
state setting, the checks that need the host), read for the preflight (tasks/roles.yml): the stack role names no
other role's settings, and a new setting touches only its own role's files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def role_settings(roles_dir: str) -> dict[str, Any]:
    """{role: its meta/settings.yml} for every role under `roles_dir` that has one, by role name."""
    found = {}
    for path in sorted(Path(roles_dir).glob("*/meta/settings.yml")):
        found[path.parent.parent.name] = yaml.safe_load(path.read_text()) or {}
    return found


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"stack_role_settings": role_settings}
