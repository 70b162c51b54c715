"""Each role declares the kind of its settings in its own meta/settings.yml (issue 41 part 3, issue 43 part 1):
the stack role's preflight (roles/stack/tasks/kinds.yml, roles.yml, roles_host.yml) applies the rule of each kind
and names no role's settings. These tests keep the declarations honest:

- a declaration names only options of its own role's argument spec (settings, host checks, the state and method
  settings, the instance settings of a role installed once per library, each kind's parameters);
- every kind declared is one the preflight knows (vars/main.yml: __stack_kind_allowed, with a rule in
  tasks/kinds.yml: a pattern or its own branch), and every kind it knows is used;
- a setting whose name says it is a path, a URL, an account, a duration or a count declares a kind: a new such
  setting cannot slip past the preflight unchecked;
- a literal default passes its own kind's pattern (the refusal suggests the default: it must be valid).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "roles" / "stack"
STACK_VARS = yaml.safe_load((STACK / "vars" / "main.yml").read_text())
ALLOWED = STACK_VARS["__stack_kind_allowed"]
PATTERNS = STACK_VARS["__stack_kind_patterns"]
KINDS_TASKS = (STACK / "tasks" / "kinds.yml").read_text()
HOST_TASKS = (STACK / "tasks" / "roles_host.yml").read_text()
DECLARING = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/settings.yml"))
# Kinds the preflight derives from another (a wheelhouse the artifact cache fills is on the controller).
DERIVED = {"wheelhouse_on_controller"}
# Names that say what a setting is; such a setting must declare a kind.
KIND_NAMES = re.compile(r"_(dir|root|prefix|venv|path|file|hostfile|url|address|timeout|seconds|retries|delay|user)$")
# Settings a name suggests are of a kind but that are checked elsewhere: the stack's catalog files are checked
# by the preflight before it loads them (tasks/config.yml) and serve the test bed's substituted catalogs.
CHECKED_ELSEWHERE = {"stack_catalog_file", "stack_gpu_ids_file", "stack_gpu_code_file"}


def _decl(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "meta" / "settings.yml").read_text()) or {}


def _options(role: str) -> dict:
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]


def _rules(table: dict) -> dict[str, dict]:
    return {name: (rule if isinstance(rule, dict) else {"kind": rule}) for name, rule in (table or {}).items()}


def test_the_roles_that_install_something_declare_their_settings():
    assert {"stack", "nvidia_driver", "nvidia_repo", "cuda", "cuda_library", "openmpi", "mindspore"} <= set(
        DECLARING
    ), DECLARING


@pytest.mark.parametrize("role", DECLARING)
def test_a_declaration_names_only_its_own_roles_settings(role):
    decl, options = _decl(role), _options(role)
    named = []
    for key in ("state", "method"):
        if key in decl:
            named.append(decl[key])
    for table in ("settings", "host"):
        for name, rule in _rules(decl.get(table)).items():
            named.append(name)
            for parameter in ("on_controller", "other", "toolkits", "create"):
                if parameter in rule:
                    named.append(rule[parameter])
    named += [f"{role}_{setting}" for setting in decl.get("instance_settings", [])]
    foreign = [name for name in named if name not in options]
    assert not foreign, f"roles/{role}/meta/settings.yml names settings its argument spec lacks: {foreign}"


@pytest.mark.parametrize("role", DECLARING)
def test_every_declared_kind_is_one_the_preflight_knows(role):
    decl = _decl(role)
    unknown = [(n, r["kind"]) for n, r in _rules(decl.get("settings")).items() if r["kind"] not in ALLOWED]
    assert not unknown, f"roles/{role}/meta/settings.yml: kinds without a rule in roles/stack: {unknown}"
    host_kinds = {r["kind"] for r in _rules(decl.get("host")).values()}
    missing = [kind for kind in host_kinds if f"rule.kind == '{kind}'" not in HOST_TASKS]
    assert not missing, f"roles/{role}/meta/settings.yml: host kinds tasks/roles_host.yml does not check: {missing}"


def test_every_kind_has_a_rule_and_is_used():
    without_rule = [k for k in ALLOWED if k not in PATTERNS and f"kind == '{k}'" not in KINDS_TASKS]
    assert not without_rule, f"kinds with a text but no rule in tasks/kinds.yml: {without_rule}"
    used = {r["kind"] for role in DECLARING for r in _rules(_decl(role).get("settings")).values()}
    unused = sorted(set(ALLOWED) - used - DERIVED)
    assert not unused, f"kinds no role declares (remove them, or declare them where they apply): {unused}"


@pytest.mark.parametrize("role", DECLARING)
def test_a_setting_named_as_a_kind_declares_one(role):
    declared = set(_rules(_decl(role).get("settings")))
    undeclared = [
        name for name in _options(role) if KIND_NAMES.search(name) and name not in declared | CHECKED_ELSEWHERE
    ]
    assert not undeclared, f"roles/{role}: settings that declare no kind in meta/settings.yml: {undeclared}"


@pytest.mark.parametrize("role", DECLARING)
def test_a_literal_default_passes_its_own_kind(role):
    options = _options(role)
    bad = []
    for name, rule in _rules(_decl(role).get("settings")).items():
        default = options[name].get("default")
        pattern = PATTERNS.get(rule["kind"])
        # As the refusal: a default is suggested only when it holds no "{{" and no space (a prose default is not).
        if default is None or pattern is None or "{{" in str(default) or " " in str(default):
            continue
        if not re.match(pattern, str(default)):
            bad.append((name, default, rule["kind"]))
    assert not bad, f"roles/{role}: defaults their own kind refuses: {bad}"


def test_the_rule_fails_when_a_kind_loses_its_pattern():
    """The check above is not vacuous: an absolute-path default fails a pattern that wants a URL."""
    assert not re.match(PATTERNS["pip_url"], "/usr/local")
    assert re.match(PATTERNS["abs"], "/usr/local")
