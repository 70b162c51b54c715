"""Every component playbook (playbooks/<component>.yml) is one play in the pattern playbooks/README.md shows: the
same hosts, privileges, tags (role::<component> and <component>), batches, apt lock wait and start of the play
(the stack role's play.yml), then the component's role. The pattern is read from the README, so the README and
the playbooks cannot drift apart; the exceptions it lists are the only ones allowed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

PLAYBOOKS = ROOT / "playbooks"
README = PLAYBOOKS / "README.md"
COMPONENTS = ("nvidia_driver", "cuda", "cudnn", "nccl", "openmpi", "mindspore", "tensorrt", "serving")
# The component playbooks whose role is shared, and the setting that names the component to it.
SHARED_ROLES = {"cudnn": "cuda_library", "nccl": "cuda_library"}
ABSENT = object()
# What a playbook may have instead of the pattern's (key: its value, ABSENT: no such key); the README lists them.
EXCEPTIONS: dict[str, dict[str, object]] = {
    "openmpi": {"serial": ABSENT, "stack_play_components": []},
}
# A role entry's keys besides `role`: its settings and its condition.
ROLE_KEYS = {"role", "vars", "when"}


def pattern(component: str) -> dict:
    """The README's pattern play for `component`."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    found = [block for block in blocks if "<component>" in block]
    assert len(found) == 1, "playbooks/README.md must show the component play in one ```yaml block"
    plays = yaml.safe_load(found[0].replace("<component>", component))
    assert isinstance(plays, list) and len(plays) == 1
    return plays[0]


def expected(component: str) -> dict:
    """The pattern with the component's exceptions applied, without the parts each playbook writes itself
    (the play's name and its roles)."""
    play = {k: v for k, v in pattern(component).items() if k not in ("name", "roles")}
    for key, value in EXCEPTIONS.get(component, {}).items():
        if key == "stack_play_components":
            play["pre_tasks"][0]["vars"][key] = value
        elif value is ABSENT:
            del play[key]
        else:
            play[key] = value
    return play


def play_of(path: Path) -> dict:
    plays = yaml.safe_load(path.read_text())
    assert isinstance(plays, list) and len(plays) == 1, f"{path.name}: one play, the component's"
    return plays[0]


@pytest.mark.parametrize("component", COMPONENTS)
def test_the_component_playbook_is_the_pattern(component):
    play = play_of(PLAYBOOKS / f"{component}.yml")
    assert isinstance(play.get("name"), str) and play["name"].strip(), f"{component}.yml: the play needs a name"
    header = {k: v for k, v in play.items() if k not in ("name", "roles")}
    want = expected(component)
    strays = sorted(k for k in set(header) | set(want) if header.get(k, ABSENT) != want.get(k, ABSENT))
    assert not strays, f"playbooks/{component}.yml strays from playbooks/README.md's pattern in: {', '.join(strays)}"


@pytest.mark.parametrize("component", COMPONENTS)
def test_the_play_applies_the_components_role(component):
    roles = play_of(PLAYBOOKS / f"{component}.yml").get("roles")
    assert isinstance(roles, list) and len(roles) == 1, f"{component}.yml: one role, the component's"
    entry = roles[0] if isinstance(roles[0], dict) else {"role": roles[0]}
    assert set(entry) <= ROLE_KEYS, f"{component}.yml: the role entry has {sorted(set(entry) - ROLE_KEYS)}"
    role = SHARED_ROLES.get(component, component)
    assert entry["role"] == role
    if role in SHARED_ROLES.values():
        assert entry.get("vars", {}).get(f"{role}_name") == component


def test_every_component_playbook_is_in_site_yml_and_follows_the_pattern():
    """site.yml imports each component playbook, and every playbook that starts its play the components' way
    (the stack role's play.yml) is one of them: a new component is not left out of these tests."""
    site = [entry["ansible.builtin.import_playbook"] for entry in yaml.safe_load((PLAYBOOKS / "site.yml").read_text())]
    assert {f"{c}.yml" for c in COMPONENTS} <= set(site)
    starts = set()
    for path in PLAYBOOKS.glob("*.yml"):
        for play in yaml.safe_load(path.read_text()) or []:
            for task in play.get("pre_tasks", []) + play.get("tasks", []):
                include = task.get("ansible.builtin.include_role", {})
                if include.get("name") == "stack" and include.get("tasks_from") == "play":
                    starts.add(path.stem)
    assert starts == set(COMPONENTS)


def test_the_readme_lists_the_exceptions():
    text = README.read_text().split("The exceptions", 1)[1]
    listed = set(re.findall(r"^- `(\w+)`:", text, flags=re.M))
    assert listed == set(EXCEPTIONS)
