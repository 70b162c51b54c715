"""Security rules every role and playbook keeps, checked on the source (fast, no host needed).

The host-side counterpart is verify/testinfra/test_security.py (owners and modes under the trees it
lists, apt keys and sources, on a converged host; not every path the roles write as root). An index
URL's password: never on a command line (test_no_index_url_or_password_reaches_a_command_line below),
never in the artifact cache's reports
(tests/unit/test_artifact_cache.py::test_an_index_password_is_never_printed), masked in the
preflight's refusal of a bad mindspore_pip_index_url
(tests/integration/test_role_settings.py::test_role_setting_is_refused_before_any_role_runs);
test_the_cited_credential_tests_exist proves these two are there and check what they are cited for.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASK_FILES = sorted(
    [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml"), *ROOT.glob("playbooks/*.yml")]
)
TEXT_FILES = sorted(
    [*TASK_FILES, *ROOT.glob("roles/*/templates/*"), *ROOT.glob("env_scripts/*"), *ROOT.glob("roles/*/files/*")]
)
INSECURE = [
    (re.compile(r"validate_certs:\s*(false|no|False)"), "TLS verification disabled"),
    (re.compile(r"--trusted-host"), "pip told to trust a host without TLS"),
    (re.compile(r"--no-check-certificate|curl\s+(-\w*k|--insecure)"), "TLS verification disabled"),
    (re.compile(r"verify\s*=\s*False|CERT_NONE|_create_unverified_context"), "TLS verification disabled"),
    (re.compile(r"\bapt[-_]key\b(?!s)"), "apt-key trusts a key for every repository"),
    (re.compile(r"trusted=yes|allow-insecure|AllowUnauthenticated|--allow-unauthenticated"), "unsigned apt"),
]
MODE = re.compile(r"^0?[0-7]?[0-7]([0-7])([0-7])$")


def tasks_in(node: object) -> Iterator[dict]:
    """Every task (dict with a module) in a task file or playbook, blocks and handlers included."""
    if isinstance(node, list):
        for item in node:
            yield from tasks_in(item)
    elif isinstance(node, dict):
        if any(k in node for k in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers")):
            for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
                yield from tasks_in(node.get(key, []))
        else:
            yield node


def all_tasks() -> list[tuple[str, dict]]:
    found = []
    for path in TASK_FILES:
        for task in tasks_in(yaml.safe_load(path.read_text()) or []):
            found.append((f"{path.relative_to(ROOT)}: {task.get('name', '?')}", task))
    return found


def module_args(task: dict, *names: str) -> dict | None:
    for name in names:
        for key in (name, f"ansible.builtin.{name}"):
            if key in task:
                return task[key] if isinstance(task[key], dict) else {}
    return None


def test_the_scan_sees_the_roles():
    assert len(TASK_FILES) > 20 and len(all_tasks()) > 150


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_tls_or_signature_check_is_disabled(path):
    # Comment lines may name what is avoided ("never apt-key's global keyring").
    lines = path.read_text(errors="replace").splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    problems = [f"{why}: {m.group(0)!r}" for pattern, why in INSECURE for m in pattern.finditer(text)]
    assert problems == [], problems


# Signing keys are pinned by their fingerprint instead (the same key may be exported as other bytes):
# the task after the download checks it before the key is trusted.
FINGERPRINT_PINNED = {"roles/nvidia_repo/tasks/present.yml: Download the repository's signing key"}


def test_every_download_is_pinned_by_a_checksum():
    for where in FINGERPRINT_PINNED:
        assert "fingerprint" in (ROOT / where.split(":")[0]).read_text(), where
    unpinned = [
        where
        for where, task in all_tasks()
        if (args := module_args(task, "get_url")) is not None and not args.get("checksum")
    ]
    assert sorted(set(unpinned) - FINGERPRINT_PINNED) == [], unpinned


def test_nothing_is_created_group_or_world_writable():
    loose = []
    for where, task in all_tasks():
        args = module_args(task, "file", "copy", "template", "get_url", "unarchive") or {}
        mode = str(args.get("mode", ""))
        numeric = MODE.match(mode)
        if (numeric and (int(numeric.group(1)) & 2 or int(numeric.group(2)) & 2)) or re.search(r"[go]\+\w*w", mode):
            loose.append(f"{where}: mode {mode}")
    assert loose == [], loose


def test_no_index_url_or_password_reaches_a_command_line():
    # Mirror URLs may carry credentials: they go to pip through the environment (PIP_INDEX_URL), never argv.
    leaking = []
    for where, task in all_tasks():
        args = module_args(task, "command", "shell") or {}
        text = " ".join(str(args.get(k, "")) for k in ("argv", "cmd"))
        text += f" {task.get('ansible.builtin.shell', '')} {task.get('ansible.builtin.command', '')}"
        if re.search(r"index_url|password|token", text, re.IGNORECASE):
            leaking.append(where)
    assert leaking == [], leaking


def test_apt_sources_name_their_keyring():
    lines = [
        (str(path.relative_to(ROOT)), line)
        for path in TEXT_FILES
        for line in path.read_text(errors="replace").splitlines()
        if re.match(r"\s*(-\s*)?[\"']?deb\s", line) or "repo: deb " in line or 'repo: "deb ' in line
    ]
    unsigned = [f"{where}: {line.strip()}" for where, line in lines if "signed-by" not in line]
    assert unsigned == [], unsigned


# The credential tests the module docstring cites: test, a password it plants, and the assertion that
# the password never shows.
CITED_CREDENTIAL_TESTS = [
    (
        "tests/unit/test_artifact_cache.py::test_an_index_password_is_never_printed",
        "http://msgpu:s3cret@",
        'assert "s3cret" not in text',
    ),
    (
        "tests/integration/test_role_settings.py::test_role_setting_is_refused_before_any_role_runs",
        "ftp://user:secret@mirror.example/simple",
        'assert "secret" not in flat',
    ),
]


def test_the_cited_credential_tests_exist():
    """A citation that goes stale (a test renamed, moved or deleted, or no longer checking the password)
    fails here instead of leaving the docstring to claim a coverage no test gives."""
    cited = set(re.findall(r"tests/\S+\.py::\w+", " ".join((__doc__ or "").split())))
    assert cited == {test for test, _, _ in CITED_CREDENTIAL_TESTS}, cited
    for test, planted, check in CITED_CREDENTIAL_TESTS:
        path, name = test.split("::")
        source = (ROOT / path).read_text()
        functions = {
            node.name: node
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef) and node.col_offset == 0
        }
        assert name in functions, f"{test} is cited for credentials but does not exist"
        assert planted in source, f"{path} no longer plants the password {planted!r}"
        body = ast.get_source_segment(source, functions[name]) or ""
        assert check in body, f"{test} no longer checks `{check}`"
