"""No host command is built by pasting a setting into a shell string.

Every `shell:`, `command:`, `raw:` and `script:` string in roles/*/tasks/*.yml (and handlers), and the
string after `-c` of an `argv:` that runs a shell (`[/bin/sh, -c, "..."]`), may only contain Jinja
expressions that cannot change the command: `| quote`d ones, numbers, constants, and the values in
SAFE_VALUES below (each with the reason it is safe). Anything else - a user setting such as
`stack_python` or `mindspore_venv` pasted as is - fails this test: a quote or `;` in the setting would
run a command on the host. Pass such values as `argv:` items or through `environment:` instead, or
add `| quote`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import jinja2
import pytest
import yaml
from jinja2 import nodes

ROOT = Path(__file__).resolve().parents[2]

# Values that may appear unquoted in a command string, and why. A dotted entry covers that value
# and everything below it (stack_resolved.disk covers part.path of a loop over it); nothing else of
# its parent is covered.
SAFE_VALUES = {
    "stack_resolved.disk": (
        "the catalog's parts of the stack: install-marker paths and Debian package names from "
        "catalog/stacks.yml (project code, checked by test_catalog_integrity.py), never a user setting"
    ),
}

# Filters whose result cannot carry shell syntax: shell quoting itself, and numbers or booleans.
SAFE_FILTERS = {"quote", "int", "float", "bool", "length", "count"}

MODULES = {"shell", "command", "raw", "script"}
SHELLS = {"sh", "bash", "dash", "zsh", "ksh"}


def _module_name(key: str) -> str | None:
    short = key.rsplit(".", 1)[-1]
    if short in MODULES and (key == short or key.startswith(("ansible.builtin.", "ansible.legacy."))):
        return short
    return None


def command_strings(tasks) -> list[tuple[str, str]]:
    """(task name, string) for every shell-parsed or argument-split string of `tasks`."""
    found: list[tuple[str, str]] = []
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for section in ("block", "rescue", "always"):
            found += command_strings(task.get(section))
        name = str(task.get("name", "?"))
        for key, value in task.items():
            if _module_name(key) is None:
                continue
            if isinstance(value, str):
                found.append((name, value))
            elif isinstance(value, dict):
                for field in ("cmd", "_raw_params"):
                    if isinstance(value.get(field), str):
                        found.append((name, value[field]))
                argv = value.get("argv")
                if isinstance(argv, list):
                    found += [(name, script) for script in _shell_scripts(argv)]
    return found


def _shell_scripts(argv: list) -> list[str]:
    """The script of an argv that runs a shell with -c (argv items are otherwise safe)."""
    if not argv or not isinstance(argv[0], str) or os.path.basename(argv[0]) not in SHELLS:
        return []
    items = [str(item) for item in argv]
    return [items[i + 1] for i, item in enumerate(items[:-1]) if item == "-c"]


def _dotted(node: nodes.Node) -> str | None:
    """`a.b.c` for a name with constant attribute or item lookups, else None."""
    parts: list[str] = []
    while True:
        if isinstance(node, nodes.Getattr):
            parts.append(node.attr)
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            parts.append(node.arg.value)
            node = node.node
        elif isinstance(node, nodes.Name):
            parts.append(node.name)
            return ".".join(reversed(parts))
        else:
            return None


def _values(node: nodes.Node) -> list[str]:
    """Every variable (as a dotted path) an expression reads."""
    dotted = _dotted(node)
    if dotted is not None:
        return [dotted]
    return [value for child in node.iter_child_nodes() for value in _values(child)]


def _is_safe_value(path: str, loop_names: set[str]) -> bool:
    if path.split(".")[0] in loop_names:
        return True
    return any(path == safe or path.startswith(safe + ".") for safe in SAFE_VALUES)


def _is_safe(node: nodes.Node, loop_names: set[str]) -> bool:
    if isinstance(node, (nodes.Const, nodes.TemplateData)):
        return True
    if isinstance(node, nodes.Filter):
        if node.name in SAFE_FILTERS:
            return True
        # `items | map('quote') | join(' ')`: every item quoted.
        inner = node.node
        if (
            node.name == "join"
            and isinstance(inner, nodes.Filter)
            and inner.name == "map"
            and inner.args
            and isinstance(inner.args[0], nodes.Const)
            and inner.args[0].value == "quote"
        ):
            return True
    if isinstance(node, nodes.CondExpr):  # the test is not output, only the branches are
        return _is_safe(node.expr1, loop_names) and (node.expr2 is None or _is_safe(node.expr2, loop_names))
    if isinstance(node, nodes.Concat):
        return all(_is_safe(part, loop_names) for part in node.nodes)
    if isinstance(node, nodes.Add):
        return _is_safe(node.left, loop_names) and _is_safe(node.right, loop_names)
    return all(_is_safe_value(path, loop_names) for path in _values(node))


def unsafe_expressions(text: str) -> list[str]:
    """The Jinja expressions of a command string that paste a value unquoted."""
    env = jinja2.Environment()
    tree = env.parse(text)
    bad: list[str] = []

    def walk(children, loop_names: set[str]) -> None:
        for child in children:
            if isinstance(child, nodes.For):
                # A loop variable is as safe as what it loops over.
                targets = {name.name for name in child.target.find_all(nodes.Name)}
                if isinstance(child.target, nodes.Name):
                    targets.add(child.target.name)
                iter_safe = all(_is_safe_value(path, loop_names) for path in _values(child.iter))
                walk([*child.body, *child.else_], loop_names | targets if iter_safe else loop_names - targets)
            elif isinstance(child, nodes.Output):
                bad.extend(_source(text, expr) for expr in child.nodes if not _is_safe(expr, loop_names))
            else:
                walk(child.iter_child_nodes(), loop_names)

    walk(tree.iter_child_nodes(), set())
    return bad


def _source(text: str, expr: nodes.Node) -> str:
    """The `{{ ... }}` of an expression, found by its line (good enough for a message)."""
    line = text.splitlines()[expr.lineno - 1] if text.splitlines() else text
    return line.strip()


def _task_files() -> list[Path]:
    return sorted([*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml")])


def test_the_scan_finds_command_strings():
    """Guard against a scan that silently finds nothing (a renamed module, a new layout)."""
    strings = [s for path in _task_files() for _, s in command_strings(yaml.safe_load(path.read_text()))]
    assert len(strings) >= 10
    assert any("{{" in s for s in strings)


@pytest.mark.parametrize("path", _task_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_setting_is_pasted_into_a_command(path: Path):
    offenders = [
        f"{path.relative_to(ROOT)}: [{name}] {expr}"
        for name, text in command_strings(yaml.safe_load(path.read_text()))
        for expr in unsafe_expressions(text)
    ]
    assert not offenders, (
        "settings pasted into a host command without `| quote` (use argv: items, environment:, or | quote; "
        "or add a value that can never carry shell syntax to SAFE_VALUES with the reason):\n" + "\n".join(offenders)
    )


# The scanner itself, on examples: what it must refuse and what it must let through.
@pytest.mark.parametrize(
    ("task", "unsafe"),
    [
        ({"ansible.builtin.shell": "ls {{ mindspore_venv }}"}, True),
        ({"ansible.builtin.shell": {"cmd": "ls '{{ mindspore_venv }}'"}}, True),
        ({"ansible.builtin.shell": {"cmd": "ls {{ mindspore_venv | quote }}"}}, False),
        ({"shell": "ls {{ (mindspore_venv ~ '/bin') | quote }}"}, False),
        ({"ansible.builtin.command": "ls {{ mindspore_venv }}"}, True),
        ({"ansible.builtin.raw": "ls {{ stack_install_prefix }}"}, True),
        ({"ansible.builtin.script": {"cmd": "probe.py {{ serving_user }}"}}, True),
        ({"ansible.builtin.script": {"cmd": "probe.py {{ serving_user | quote }} {{ retries | int }}"}}, False),
        ({"ansible.builtin.command": {"argv": ["/bin/sh", "-c", "'{{ stack_python }}' -c 'import sys'"]}}, True),
        ({"ansible.builtin.command": {"argv": ["bash", "-c", "{{ stack_python | quote }} -V"]}}, False),
        ({"ansible.builtin.command": {"argv": ["{{ stack_python }}", "-c", "import sys"]}}, False),
        ({"ansible.builtin.command": {"argv": ["grep", "-c", "{{ pattern }}", "/proc/modules"]}}, False),
        ({"ansible.builtin.shell": "ssh {{ hosts | map('quote') | join(' ') }}"}, False),
        ({"ansible.builtin.shell": "ssh {{ hosts | join(' ') }}"}, True),
        ({"ansible.builtin.shell": "run {{ '--check' if ansible_check_mode else '' }}"}, False),
        ({"ansible.builtin.shell": "run {{ '--user=' ~ serving_user if x else '' }}"}, True),
        ({"ansible.builtin.shell": "{% for p in stack_resolved.disk %}{{ p.path }}\n{% endfor %}"}, False),
        ({"ansible.builtin.shell": "{% for p in stack_sources %}{{ p }}\n{% endfor %}"}, True),
        ({"ansible.builtin.shell": "echo {{ stack_resolved.sources.pypi }}"}, True),
        ({"block": [{"ansible.builtin.shell": "rm -rf {{ serving_work_dir }}"}]}, True),
    ],
)
def test_the_scanner_on_examples(task, unsafe):
    found = [expr for _, text in command_strings([task]) for expr in unsafe_expressions(text)]
    assert bool(found) == unsafe, found


# Programs the roles hand to python3 as an argument or on its standard input, read with
# lookup('ansible.builtin.file', ...) into a module argument: Ansible would template a Jinja delimiter in them.
PASSED_PROGRAMS = re.compile(r"lookup\('ansible\.builtin\.file', '([^']+\.py)'\)")


def test_programs_passed_through_a_lookup_hold_no_jinja_delimiters():
    found = {
        (source.parents[1] / "files" / name)
        for source in [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/vars/*.yml")]
        for name in PASSED_PROGRAMS.findall(source.read_text())
    }
    assert {path.name for path in found} >= {"library_probe.py", "host_check.py", "tensorrt_probe.py"}
    for path in found:
        text = path.read_text()
        assert not any(delimiter in text for delimiter in ("{{", "{%", "{#")), path
