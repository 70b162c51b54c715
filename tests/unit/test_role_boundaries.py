"""A role reads no other role's settings (issue 41): what roles share goes through the facts the stack role
publishes (stack_resolved), and an internal role's inputs (host_utils_*, artifacts_*) are passed to it as vars.

The check reads every role's tasks, defaults, vars and handlers and finds, in their Jinja expressions (inside
{{ }} and {% %}, and the values of when/that/until/changed_when/failed_when/loop), the names of other roles'
settings (their meta/argument_specs.yml options; cuDNN's and NCCL's <component>_<setting> names for
cuda_library). Names in prose (task names, messages) do not count.

REMAINING lists the reads that are still there, each with why: the list may only shrink. A new read fails the
test; a read that is gone fails it too until it is taken off the list.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
CONDITIONS = ("when", "that", "until", "changed_when", "failed_when", "loop")

# (role, file, another role's setting): why it is still read there.
REMAINING = {
    # The values the stack publishes in stack_resolved.shared are computed from the roles that own them; the
    # owner should become a stack setting (stack_env_dir, stack_user, stack_venv) with the role settings as
    # deprecated aliases (issue 41 part 2, left open).
    ("stack", "vars/main.yml", "cuda_env_dir"): "shared.cuda_env_file",
    ("stack", "vars/main.yml", "mindspore_env_dir"): "shared.mindspore_env_file",
    ("stack", "vars/main.yml", "tensorrt_env_dir"): "shared.tensorrt_env_file",
    ("stack", "vars/main.yml", "mindspore_user"): "shared.user (the venv owner and MPI user)",
    ("stack", "vars/main.yml", "mindspore_venv"): "shared.venv (TensorRT and Serving install into it)",
    # The preflight's host checks plan around the driver's state and module kind before the role runs.
    ("stack", "tasks/host.yml", "nvidia_driver_state"): "an uninstall needs no GPU checks",
    ("stack", "tasks/secure_boot.yml", "nvidia_driver_module"): "Secure Boot needs a signed (precompiled) module",
    # The default account choice follows the mindspore role's (one user for the venv and MPI).
    ("openmpi", "defaults/main.yml", "mindspore_user_create"): "openmpi_user_create's default",
    # The verify role checks what other roles built, with their settings.
    ("verify", "defaults/main.yml", "mindspore_cuda_prefix"): "verify_cuda_prefix's default",
    ("verify", "defaults/main.yml", "openmpi_hostfile"): "verify_mpi_hostfile's default",
    ("verify", "tasks/mpi_smoke.yml", "openmpi_hostfile"): "the MPI smoke test's hostfile",
    ("verify", "tasks/mpi_smoke.yml", "openmpi_user"): "the MPI smoke test's user",
    ("verify", "tasks/doctor.yml", "nccl_expected_version"): "the NCCL release the site says it reports",
}


def _settings() -> dict[str, set[str]]:
    names = {}
    for role in ROLES:
        spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        names[role] = {name for entry in spec.values() for name in (entry.get("options") or {})}
    names["cuda_library"] |= {
        f"{component}_{setting}"
        for component in ("cudnn", "nccl")
        for setting in ("state", "cuda_prefix", "expected_version", "pip_cert")
    }
    return names


def _expressions(node, key=None):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _expressions(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _expressions(v, key)
    elif isinstance(node, str):
        yield from JINJA.findall(node)
        if key in CONDITIONS:
            yield node


def reads(text_of) -> set[tuple[str, str, str]]:
    """(role, file, another role's setting) for every read; text_of(path) gives a file's YAML text."""
    settings = _settings()
    found = set()
    for role in ROLES:
        for path in sorted((ROOT / "roles" / role).glob("*/*.yml")):
            if path.parent.name not in ("tasks", "defaults", "vars", "handlers"):
                continue
            expressions = " ".join(_expressions(yaml.safe_load(text_of(path))))
            for other in ROLES:
                for name in settings[other] if other != role else ():
                    if re.search(r"(?<![\w.'\"])" + re.escape(name) + r"\b", expressions):
                        found.add((role, f"{path.parent.name}/{path.name}", name))
    return found


def test_no_role_reads_another_roles_settings_beyond_the_known_list():
    found = reads(Path.read_text)
    new = sorted(found - set(REMAINING))
    gone = sorted(set(REMAINING) - found)
    assert not new, f"roles read other roles' settings (read stack_resolved instead): {new}"
    assert not gone, f"no longer read, take them off REMAINING: {gone}"


def test_the_check_sees_a_read_in_a_condition():
    """Not vacuous: a `when` naming another role's setting counts; the same name in a task's name does not."""
    target = ROOT / "roles" / "cuda" / "tasks" / "main.yml"
    original = target.read_text()
    prose = "\n- name: Mention mindspore_venv in prose only\n  ansible.builtin.meta: noop\n"
    extra = prose + "  when: mindspore_venv | length > 0\n"
    found = reads(lambda path: original + extra if path == target else path.read_text())
    assert ("cuda", "tasks/main.yml", "mindspore_venv") in found
    found = reads(lambda path: original + prose if path == target else path.read_text())
    assert ("cuda", "tasks/main.yml", "mindspore_venv") not in found
