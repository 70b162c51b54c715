"""Each role variable is described once, in the role's meta/argument_specs.yml (issue 16 part 4).

`defaults/main.yml` holds bare values; `ansible-doc -t role -r roles <role>` shows the descriptions; the
role READMEs point there. These tests keep the spec and the defaults from drifting apart, for every role:

- every variable of defaults/main.yml is an option of an entry point (all of them are in `main` today);
- every option that declares a `default` is in defaults/main.yml with the same value (after YAML load;
  types compared too, so `0` is not `false`; whitespace inside a template's {{ }} ignored, as Jinja does),
  in every entry point that lists it;
- a `choices` list contains the default, and the default has the option's `type` (and `elements`);
- a `required` option declares no default; defaults/main.yml may only hold an empty placeholder for it
  (cuda_library_name: "" - its choices refuse it, so every run must set it).

The role READMEs name `ansible-doc -t role -r roles <role>` and list no variable in a table, and
defaults/main.yml carries its header and at most a few one-line grouping comments, no prose.

A default that is a Jinja template in defaults/main.yml is mirrored LITERALLY in the spec (the same string),
not omitted: ansible-doc then shows where the value comes from, the comparison stays exact, and nothing
changes at run time - defaults/main.yml always defines the variable, so Ansible never falls back to the
spec's default; the preflight (roles/stack/tasks/specs.yml) drops the spec's defaults before it validates
and prints a default in a message only when it holds no "{{" and no space. Templated values are strings
until Ansible renders them, so their type and choices are not checked here.

PROSE_DEFAULTS are the exceptions that predate this rule: the spec's default describes the templated value
in words ("true with the artifact cache, else false"). They are listed one by one; changing one of them to
the literal template (and removing it here) is a spec `default` change, left to a change of its own.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if path.is_dir())

PROSE_DEFAULTS = {
    ("mindspore", "mindspore_wheelhouse"),
    ("mindspore", "mindspore_wheelhouse_on_controller"),
    ("serving", "serving_wheelhouse"),
    ("serving", "serving_wheelhouse_on_controller"),
    ("verify", "verify_mnist_cache_dir"),
}

# The Python type a spec `type` (or `elements`) needs of a YAML-loaded default; raw takes anything.
TYPES = {"str": str, "path": str, "int": int, "bool": bool, "float": (int, float), "list": list, "dict": dict}

HEADER = "# Values only; each variable is described in meta/argument_specs.yml (ansible-doc -t role -r roles {role})."
# Beyond the header, defaults/main.yml may carry short one-line grouping comments, never prose.
MAX_GROUP_COMMENTS = 6
MAX_GROUP_COMMENT_WIDTH = 60


def is_template(value) -> bool:
    return isinstance(value, str) and "{{" in value


def jinja_spaced(value: str) -> str:
    """Whitespace inside {{ }} means nothing to Jinja: a template folded over two lines (`>-` keeps the line
    break of a more-indented line) equals the same template on one line."""
    return re.sub(r"{{.*?}}", lambda m: " ".join(m.group(0).split()), value, flags=re.DOTALL)


def same(a, b) -> bool:
    """Equal after YAML load, with types: 1 is not true, "1" is not 1."""
    if type(a) is not type(b):
        return False
    if is_template(a):
        return jinja_spaced(a) == jinja_spaced(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def has_type(value, kind: str) -> bool:
    if kind == "raw":
        return True
    if isinstance(value, bool) and kind in ("int", "float"):
        return False
    return isinstance(value, TYPES[kind])


def load_role(role_dir: Path) -> tuple[dict, dict]:
    defaults_file = role_dir / "defaults" / "main.yml"
    defaults = (yaml.safe_load(defaults_file.read_text()) if defaults_file.is_file() else None) or {}
    specs = yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return defaults, specs


def spec_problems(role: str, defaults: dict, specs: dict) -> list[str]:
    """Every way the role's argument specs and its defaults/main.yml disagree, one line each."""
    problems: list[str] = []
    entries_of: dict[str, list[str]] = {}
    for entry, spec in specs.items():
        for name, option in (spec.get("options") or {}).items():
            entries_of.setdefault(name, []).append(entry)
            where = f"{role} {entry}: {name}"
            kind = option.get("type", "str")
            if not option.get("description"):
                problems.append(f"{where}: no description")
            if option.get("required"):
                if "default" in option:
                    problems.append(f"{where}: required, yet the spec declares a default")
                if name in defaults and defaults[name] not in ("", None):
                    problems.append(
                        f"{where}: required, so defaults/main.yml may only hold an empty placeholder,"
                        f" not {defaults[name]!r}"
                    )
                continue
            if "default" not in option:
                if name in defaults:
                    problems.append(f"{where}: defaults/main.yml sets {defaults[name]!r}, the spec declares no default")
                continue
            default = option["default"]
            if name not in defaults:
                problems.append(f"{where}: the spec's default {default!r} is not in defaults/main.yml")
                continue
            value = defaults[name]
            if (role, name) in PROSE_DEFAULTS:
                if not (is_template(value) and isinstance(default, str) and " " in default and default != value):
                    problems.append(
                        f"{where}: listed in PROSE_DEFAULTS, but the spec's default {default!r} is not"
                        f" words describing the template {value!r}; mirror it literally and unlist it"
                    )
                continue
            if not same(default, value):
                problems.append(f"{where}: the spec's default {default!r} differs from defaults/main.yml's {value!r}")
            if is_template(value):
                continue
            if "choices" in option and not any(same(value, choice) for choice in option["choices"]):
                problems.append(f"{where}: the default {value!r} is not one of its choices {option['choices']}")
            if kind not in TYPES and kind != "raw":
                problems.append(f"{where}: unknown type {kind!r}")
            elif not has_type(value, kind):
                problems.append(f"{where}: the default {value!r} is not of type {kind}")
            elif kind == "list" and "elements" in option:
                wrong = [item for item in value if not has_type(item, option["elements"])]
                if wrong:
                    problems.append(f"{where}: {wrong!r} in the default are not {option['elements']} elements")
    for name in defaults:
        if name not in entries_of:
            problems.append(f"{role}: {name} is in defaults/main.yml but in no entry point's options")
    return problems


def prose_problems(role: str, text: str) -> list[str]:
    """defaults/main.yml: the header, then values and at most a few one-line grouping comments."""
    lines = text.splitlines()
    header = HEADER.format(role=role)
    if lines[:2] != ["---", header]:
        return [f"{role}: defaults/main.yml must start with '---' and {header!r}"]
    problems = []
    grouping = 0
    previous_was_comment = True  # the header
    for number, line in enumerate(lines[2:], 3):
        if line.lstrip().startswith("#"):
            grouping += 1
            if previous_was_comment:
                problems.append(f"{role}:{number}: a comment of more than one line (describe it in the spec)")
            if len(line.strip()) > MAX_GROUP_COMMENT_WIDTH:
                problems.append(f"{role}:{number}: a grouping comment longer than {MAX_GROUP_COMMENT_WIDTH} characters")
            previous_was_comment = True
            continue
        previous_was_comment = False
        if re.search(r"\s#", line):
            problems.append(f"{role}:{number}: a comment after a value (describe it in the spec)")
    if grouping > MAX_GROUP_COMMENTS:
        problems.append(f"{role}: {grouping} grouping comments, at most {MAX_GROUP_COMMENTS}")
    return problems


@pytest.mark.parametrize("role", ROLES)
def test_specs_and_defaults_agree(role):
    assert (ROOT / "roles" / role / "meta" / "argument_specs.yml").is_file(), f"{role}: meta/argument_specs.yml"
    defaults, specs = load_role(ROOT / "roles" / role)
    assert "main" in specs, f"{role}: no main entry point"
    problems = spec_problems(role, defaults, specs)
    assert not problems, "\n".join(problems)


# A role without settings of its own (the internal host_utils) has no defaults file.
@pytest.mark.parametrize("role", [r for r in ROLES if (ROOT / "roles" / r / "defaults" / "main.yml").is_file()])
def test_defaults_hold_values_only(role):
    defaults_file = ROOT / "roles" / role / "defaults" / "main.yml"
    problems = prose_problems(role, defaults_file.read_text())
    assert not problems, "\n".join(problems)


def readme_problems(role: str, readme: str) -> list[str]:
    """A role README names the ansible-doc command and describes no variable in a table."""
    problems = []
    if f"ansible-doc -t role -r roles {role}" not in readme:
        problems.append(f"roles/{role}/README.md does not name `ansible-doc -t role -r roles {role}`")
    _, specs = load_role(ROOT / "roles" / role)
    options = {name for spec in specs.values() for name in spec.get("options") or {}}
    lines = readme.splitlines()
    rows = [
        match.group(1)
        for line, following in zip(lines, [*lines[1:], ""])
        if (match := re.match(r"\|\s*`(\w+)`", line))
        and match.group(1) in options
        and not following.startswith("| ---")  # a table's header row may name a variable
    ]
    if rows:
        problems.append(f"roles/{role}/README.md describes variables in a table: {rows}")
    return problems


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_points_to_ansible_doc(role):
    """The variables are described in the spec only: the README names the command, lists none of them."""
    problems = readme_problems(role, (ROOT / "roles" / role / "README.md").read_text())
    assert not problems, "\n".join(problems)


def test_a_variable_table_in_a_readme_is_caught():
    readme = (ROOT / "roles" / "cuda" / "README.md").read_text()
    table = "| variable | default | meaning |\n| --- | --- | --- |\n| `cuda_state` | `present` | or `absent` |\n"
    assert readme_problems("cuda", readme + "\n" + table)
    assert readme_problems("cuda", readme.replace("ansible-doc -t role -r roles cuda", "ansible-doc"))


def test_prose_defaults_are_still_exceptions():
    """An entry of PROSE_DEFAULTS that the spec now mirrors literally must leave the list."""
    for role, name in sorted(PROSE_DEFAULTS):
        defaults, specs = load_role(ROOT / "roles" / role)
        assert name in defaults, (role, name)
        assert specs["main"]["options"][name]["default"] != defaults[name], (role, name)


# Each mutation of a copy of the real files must be caught: (role, what is changed, the name the problem names).
def _set_default(entry, name, value):
    def mutate(defaults, specs):
        if entry is None:
            defaults[name] = value
        else:
            specs[entry]["options"][name]["default"] = value

    return mutate


def _drop_default(name):
    def mutate(defaults, specs):
        del defaults[name]

    return mutate


def _set_choices(name, choices):
    def mutate(defaults, specs):
        specs["main"]["options"][name]["choices"] = choices

    return mutate


def _both(name, value):
    def mutate(defaults, specs):
        defaults[name] = value
        specs["main"]["options"][name]["default"] = value

    return mutate


def _placeholder(name, value):
    def mutate(defaults, specs):
        defaults[name] = value

    return mutate


MUTATIONS = {
    "a default changed in defaults/main.yml": (
        "cuda",
        _set_default(None, "cuda_installer_timeout", 3601),
        "cuda_installer_timeout",
    ),
    "a default changed in a spec's other entry point": (
        "verify",
        _set_default("gpu_smoke", "verify_warmup_timeout", 1801),
        "verify_warmup_timeout",
    ),
    "a variable only in defaults/main.yml": ("cuda", _set_default(None, "cuda_new_setting", 1), "cuda_new_setting"),
    "a spec default missing from defaults/main.yml": ("stack", _drop_default("stack_offline"), "stack_offline"),
    "false written as 0": ("stack", _set_default(None, "stack_no_gpu", 0), "stack_no_gpu"),
    "a template not mirrored literally": (
        "cuda",
        _set_default("main", "cuda_method", "{{ stack_resolved.cuda.methods }}"),
        "cuda_method",
    ),
    "choices without the default": ("cuda", _set_choices("cuda_state", ["absent"]), "cuda_state"),
    "a default of the wrong type on both sides": (
        "cuda",
        _both("cuda_installer_timeout", "3600"),
        "cuda_installer_timeout",
    ),
    "list elements of the wrong type": ("serving", _both("serving_device_ids", ["0"]), "serving_device_ids"),
    "a value for a required option": ("cuda_library", _placeholder("cuda_library_name", "cudnn"), "cuda_library_name"),
    "a prose default made literal": (
        "serving",
        _both("serving_wheelhouse_on_controller", "{{ true }}"),
        "serving_wheelhouse_on_controller",
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_disagreement_is_caught(mutation):
    role, mutate, name = MUTATIONS[mutation]
    defaults, specs = load_role(ROOT / "roles" / role)
    assert not spec_problems(role, defaults, specs)
    defaults, specs = copy.deepcopy(defaults), copy.deepcopy(specs)
    mutate(defaults, specs)
    problems = spec_problems(role, defaults, specs)
    assert any(name in problem for problem in problems), problems


@pytest.mark.parametrize(
    "edit",
    [
        "cuda_state: present\n# present installs the toolkits;\n# absent removes them.\n",
        "cuda_state: present  # or absent\n",
        "# The state of the toolkits, present or absent, and what each of them means here\ncuda_state: present\n",
    ],
)
def test_prose_in_defaults_is_caught(tmp_path, edit):
    text = (ROOT / "roles" / "cuda" / "defaults" / "main.yml").read_text()
    assert not prose_problems("cuda", text)
    copy_file = tmp_path / "main.yml"
    copy_file.write_text(text.replace("cuda_state: present\n", edit))
    assert prose_problems("cuda", copy_file.read_text())
    assert yaml.safe_load(copy_file.read_text())["cuda_state"] == "present"
