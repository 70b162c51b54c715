"""The roles' own settings are refused in site.yml's preflight, before any role runs.

Each row is an invalid setting of one role (nvidia_driver, nvidia_repo, cuda, cuDNN/NCCL through
cuda_library, openmpi, mindspore, tensorrt, serving) with what its message must say: the variable,
and what is allowed. The rows of a stage go into ONE site.yml run against a real container: the
preflight reports every bad setting of a stage in one message, one line each, so each row is still
asserted on its own line; the stages differ in where the check runs (types and choices, then the
rules a spec cannot say, both on the controller; then what needs the host). Every run must fail,
leave the host's fingerprint unchanged, and run no task of any role but the preflight's.
"""

from __future__ import annotations

import pytest

from testbed import sandbox
from tests.conftest import unpinned_files

from .conftest import run_playbook

# The roles site.yml applies after the preflight; none of their tasks may run.
ROLES = ("nvidia_driver", "nvidia_repo", "cuda", "cuda_library", "openmpi", "mindspore", "tensorrt", "serving")

# Settings every row of a stage shares: Serving (and so TensorRT) on, and the driver from NVIDIA's CUDA
# repository, so that the tensorrt, serving and nvidia_repo roles are part of the run.
ALL_ROLES = {"stack_serving_enabled": True, "stack_driver_method": "cuda_repo"}
STAGES = {
    # The stack role's own spec (checked first, in tasks/config.yml).
    "stack-spec": {},
    # The kinds of the stack role's own settings (its meta/settings.yml; tasks/config.yml, after the spec).
    "stack-rules": {},
    # Types and choices from each role's meta/argument_specs.yml (tasks/roles.yml, controller side).
    "spec": ALL_ROLES,
    # Rules a spec cannot say: paths, URLs, numbers in range, names, files on the controller.
    "rules": ALL_ROLES,
    # What needs the host: accounts the roles may not create, CA bundles, the interpreter.
    "host": ALL_ROLES,
    # A missing MPI user stops every host (as the openmpi role does); its own run.
    "mpi-host": {},
    # A quote in an interpreter path must not run a command on the host.
    "injection-stack": {},
    "injection-mindspore": {},
}
# Stages that never contact the host: their checks run on the controller only.
CONTROLLER_STAGES = {"stack-spec", "stack-rules", "spec", "rules"}

INJECTED = "/usr/bin/python3'; touch /msgpu-pwned; '"


def row(stage: str, settings: dict, *expected: str, id: str):
    return pytest.param(stage, settings, list(expected), id=f"{stage}-{id}")


ROWS = [
    # The stack's own choices: an empty choice is listed readably, never as "must be one of: , distro".
    row(
        "stack-spec",
        {"stack_driver_method": "dkms"},
        'stack_driver_method: "dkms" is not allowed; allowed: distro, runfile, cuda_repo, or "" (the default).',
        id="stack-choice",
    ),
    row(
        "stack-spec",
        {"stack_artifact_cache_retries": "twice"},
        'stack_artifact_cache_retries: "twice" is not allowed; allowed: a whole number (default: 3).',
        id="stack-int",
    ),
    # Types and choices (each role's argument spec).
    row(
        "spec",
        {"nvidia_driver_reboot_timeout": "soon"},
        'nvidia_driver_reboot_timeout: "soon" is not allowed; allowed: a whole number (default: 900).',
        id="nvidia_driver-int",
    ),
    row(
        "spec",
        {"nvidia_driver_module": "signed"},
        'nvidia_driver_module: "signed" is not allowed; allowed: auto, dkms, precompiled (default: "auto").',
        id="nvidia_driver-module",
    ),
    row(
        "spec",
        {"nvidia_driver_hold": "maybe"},
        'nvidia_driver_hold: "maybe" is not allowed; allowed: true or false (default: true).',
        id="nvidia_driver-bool",
    ),
    row(
        "spec",
        {"nvidia_repo_pin_priority": "high"},
        'nvidia_repo_pin_priority: "high" is not allowed; allowed: a whole number (default: 600).',
        id="nvidia_repo-int",
    ),
    row(
        "spec",
        {"cuda_profile_d": "sometimes"},
        'cuda_profile_d: "sometimes" is not allowed; allowed: true or false (default: false).',
        id="cuda-bool",
    ),
    row(
        "spec",
        {"cuda_installer_timeout": "1h"},
        'cuda_installer_timeout: "1h" is not allowed; allowed: a whole number (default: 3600).',
        id="cuda-int",
    ),
    row(
        "spec",
        {"cudnn_state": "gone"},
        'cudnn_state: "gone" is not allowed; allowed: present, absent (default: "present").',
        id="cudnn-choice",
    ),
    row(
        "spec",
        {"cuda_library_poll_seconds": "fast"},
        'cuda_library_poll_seconds: "fast" is not allowed (cudnn); allowed: a whole number (default: 10).',
        'cuda_library_poll_seconds: "fast" is not allowed (nccl); allowed: a whole number (default: 10).',
        id="cuda_library-int",
    ),
    row(
        "spec",
        {"openmpi_slots_no_gpu": "many"},
        'openmpi_slots_no_gpu: "many" is not allowed; allowed: a whole number (default: 1).',
        id="openmpi-int",
    ),
    row(
        "spec",
        {"openmpi_cluster": "perhaps"},
        'openmpi_cluster: "perhaps" is not allowed; allowed: true or false.',
        id="openmpi-bool",
    ),
    row(
        "spec",
        {"mindspore_user_create": "perhaps"},
        'mindspore_user_create: "perhaps" is not allowed; allowed: true or false (default: true).',
        id="mindspore-bool",
    ),
    row(
        "spec",
        {"mindspore_import_timeout": "5m"},
        'mindspore_import_timeout: "5m" is not allowed; allowed: a whole number (default: 300).',
        id="mindspore-int",
    ),
    row(
        "spec",
        {"tensorrt_check_timeout": "long"},
        'tensorrt_check_timeout: "long" is not allowed; allowed: a whole number (default: 300).',
        id="tensorrt-int",
    ),
    row(
        "spec",
        {"serving_device_type": "TPU"},
        'serving_device_type: "TPU" is not allowed; allowed: GPU, Ascend, CPU, or "" (the default).',
        id="serving-choice",
    ),
    row(
        "spec",
        {"serving_device_ids": ["first"]},
        'serving_device_ids: ["first"] is not allowed; allowed: a list of whole numbers (default: [0]).',
        id="serving-int-list",
    ),
    row(
        "spec",
        {"serving_service_enabled": "perhaps"},
        'serving_service_enabled: "perhaps" is not allowed; allowed: true or false (default: false).',
        id="serving-bool",
    ),
    # Rules a spec cannot say.
    # The kinds of the stack's own settings: a relative install prefix (every CUDA toolkit's root follows it).
    row(
        "stack-rules",
        {"stack_install_prefix": "usr/local"},
        'stack_install_prefix: "usr/local" is not allowed; allowed: an absolute path (default: "/usr/local").',
        id="stack-prefix",
    ),
    row(
        "stack-rules",
        {"stack_artifact_cache_dir": "cache/msgpu"},
        'stack_artifact_cache_dir: "cache/msgpu" is not allowed; allowed: "" (off) or an absolute path.',
        id="stack-cache-dir",
    ),
    # apt's lock timeout has one owner (stack_apt_lock_timeout); the older name still reaches it, and is checked.
    row(
        "stack-rules",
        {"apt_lock_timeout": "soon"},
        'stack_apt_lock_timeout: "soon" is not allowed; allowed: a whole number >= 1.',
        id="stack-apt-lock-timeout",
    ),
    row(
        "rules",
        {"serving_cuda_cache_path": "nv/ComputeCache"},
        'serving_cuda_cache_path: "nv/ComputeCache" is not allowed; allowed: "" (the default) or an absolute path.',
        id="serving-cuda-cache",
    ),
    row(
        "rules",
        {"nvidia_driver_reboot_timeout": -5},
        "nvidia_driver_reboot_timeout: -5 is not allowed; allowed: a whole number >= 1 (default: 900).",
        id="nvidia_driver-timeout",
    ),
    row(
        "rules",
        {"nvidia_driver_tmpdir": "tmp"},
        'nvidia_driver_tmpdir: "tmp" is not allowed; allowed: an absolute path (default: "/tmp").',
        id="nvidia_driver-path",
    ),
    row(
        "rules",
        {"nvidia_repo_url": "deb http://mirror.example/cuda"},
        'nvidia_repo_url: "deb http://mirror.example/cuda" is not allowed; allowed: "" (the catalog\'s) or an '
        "http://, https:// or file:// URL.",
        id="nvidia_repo-url",
    ),
    row(
        "rules",
        {"nvidia_repo_key_fingerprint": "3bf863cc"},
        'nvidia_repo_key_fingerprint: "3bf863cc" is not allowed; allowed: "" (the catalog\'s) or 40 hexadecimal '
        "digits.",
        id="nvidia_repo-fingerprint",
    ),
    row(
        "rules",
        {"nvidia_repo_catalog_file": "/nonexistent/stacks.yml"},
        'nvidia_repo_catalog_file: "/nonexistent/stacks.yml" is not allowed; allowed: a file that exists on the '
        "controller.",
        id="nvidia_repo-controller-file",
    ),
    row(
        "rules",
        {"cuda_install_root": "usr/local"},
        'cuda_install_root: "usr/local" is not allowed; allowed: an absolute path.',
        id="cuda-path",
    ),
    row(
        "rules",
        {"cuda_default_version": "11.6"},
        'cuda_default_version: "11.6" is not allowed; allowed: one of the toolkits to install, 11.1.',
        id="cuda-default-version",
    ),
    row(
        "rules",
        {"cuda_download_retries": -1},
        "cuda_download_retries: -1 is not allowed; allowed: a whole number >= 0 (default: 3).",
        id="cuda-retries",
    ),
    row(
        "rules",
        {"cudnn_cuda_prefix": "cuda-11.1"},
        'cudnn_cuda_prefix: "cuda-11.1" is not allowed; allowed: "" (the default) or an absolute path.',
        id="cudnn-prefix",
    ),
    row(
        "rules",
        {"nccl_pip_cert": "ca.pem"},
        'nccl_pip_cert: "ca.pem" is not allowed; allowed: "" (the default) or an absolute path.',
        id="nccl-cert",
    ),
    row(
        "rules",
        {"openmpi_slots_no_gpu": 0},
        "openmpi_slots_no_gpu: 0 is not allowed; allowed: a whole number >= 1 (default: 1).",
        id="openmpi-slots",
    ),
    row(
        "rules",
        {"openmpi_user": "root"},
        'openmpi_user: "root" is not allowed; allowed: an account name (a-z, 0-9, _ -; at most 32 characters), '
        "not root (mpirun refuses root).",
        id="openmpi-root",
    ),
    row(
        "rules",
        {"openmpi_hostfile": "/etc/msgpu/my hostfile"},
        'openmpi_hostfile: "/etc/msgpu/my hostfile" is not allowed; allowed: an absolute path without spaces '
        '(default: "/etc/msgpu/mpi/hostfile").',
        id="openmpi-hostfile",
    ),
    row(
        "rules",
        {"mindspore_pip_index_url": "ftp://user:secret@mirror.example/simple"},
        'mindspore_pip_index_url: "ftp://***@mirror.example/simple" is not allowed; allowed: an http://, https:// '
        "or file:// URL.",
        id="mindspore-index-url",
    ),
    row(
        "rules",
        {"mindspore_venv": "venvs/mindspore"},
        'mindspore_venv: "venvs/mindspore" is not allowed; allowed: "" (the default) or an absolute path.',
        id="mindspore-venv",
    ),
    row(
        "rules",
        {"mindspore_user": "ms user"},
        'mindspore_user: "ms user" is not allowed; allowed: an account name (letters, digits, _ . -; at most 32 '
        'characters) (default: "msgpu").',
        id="mindspore-user",
    ),
    row(
        "rules",
        {"mindspore_wheelhouse": "/nonexistent/wheelhouse", "mindspore_wheelhouse_on_controller": True},
        'mindspore_wheelhouse: "/nonexistent/wheelhouse" is not allowed; allowed: "" (the pip index) or a folder '
        "that exists on the controller.",
        id="mindspore-wheelhouse",
    ),
    row(
        "rules",
        {"tensorrt_python_tag": "py38"},
        'tensorrt_python_tag: "py38" is not allowed; allowed: "" (the preflight\'s) or a CPython tag such as cp38.',
        id="tensorrt-tag",
    ),
    row(
        "rules",
        {"tensorrt_pip_cert": "certs/ca.pem"},
        'tensorrt_pip_cert: "certs/ca.pem" is not allowed; allowed: "" (the default) or an absolute path.',
        id="tensorrt-cert",
    ),
    row(
        "rules",
        {"serving_grpc_address": "127.0.0.1:grpc"},
        'serving_grpc_address: "127.0.0.1:grpc" is malformed; allowed: HOST:PORT (port 1-65535, e.g. '
        "127.0.0.1:5500) or unix:/absolute/path.",
        id="serving-port-not-a-number",
    ),
    row(
        "rules",
        {"serving_restful_address": "127.0.0.1:70000"},
        'serving_restful_address: "127.0.0.1:70000" is malformed; allowed: "" (off) or HOST:PORT (port 1-65535, '
        "e.g. 127.0.0.1:1500).",
        id="serving-port-out-of-range",
    ),
    row(
        "rules",
        {"serving_service_name": "msgpu-serving.service"},
        'serving_service_name: "msgpu-serving.service" is not allowed; allowed: a systemd unit name without .service',
        id="serving-unit-name",
    ),
    row(
        "rules",
        {"serving_servables": ["lenet", ".."]},
        'serving_servables: [".."] are not folder names; allowed: names of folders in serving_servables_dir '
        "(letters, digits, _ . -, not . or ..).",
        id="serving-servables",
    ),
    row(
        "rules",
        {"serving_work_dir": "/var/lib/msgpu/$HOME"},
        'serving_work_dir: "/var/lib/msgpu/$HOME" is not allowed; allowed: an absolute path without spaces, quotes, '
        "backslashes, $ or %",
        id="serving-path",
    ),
    # What needs the host.
    row(
        "host",
        {"mindspore_user_create": False, "mindspore_user": "msgpu-missing", "openmpi_user_create": True},
        'mindspore_user: "msgpu-missing" does not exist on this host and mindspore_user_create is false; allowed: '
        "an existing account.",
        id="mindspore-user-missing",
    ),
    row(
        "host",
        {"mindspore_pip_cert": "/etc/ssl/private/missing-ca.pem"},
        'mindspore_pip_cert: "/etc/ssl/private/missing-ca.pem" is not a file on this host; allowed: "" (the system '
        "CA bundle) or the path of a CA bundle on the host.",
        id="mindspore-cert-missing",
    ),
    row(
        "host",
        {"serving_pip_cert": "/etc/ssl/missing-serving-ca.pem"},
        'serving_pip_cert: "/etc/ssl/missing-serving-ca.pem" is not a file on this host;',
        id="serving-cert-missing",
    ),
    row(
        "host",
        {"mindspore_python": "/opt/python3.9/bin/python3"},
        'mindspore_python: "/opt/python3.9/bin/python3" does not run on this host; allowed: an interpreter with a '
        "mindspore-gpu 1.5.1 wheel",
        id="mindspore-python-missing",
    ),
    row(
        "mpi-host",
        {"openmpi_user_create": False, "openmpi_user": "mpi-missing"},
        'openmpi_user: "mpi-missing" does not exist on this host and openmpi_user_create is false; allowed: an '
        "existing account.",
        id="openmpi-user-missing",
    ),
    # A quote in a setting never runs a command on the host (it was pasted into /bin/sh -c before).
    row("injection-stack", {"stack_python": INJECTED}, "does not run on this host", id="stack_python-quote"),
    row(
        "injection-mindspore",
        {"mindspore_python": INJECTED},
        "mindspore_python: ",
        "does not run on this host; allowed: an interpreter with a mindspore-gpu",
        id="mindspore_python-quote",
    ),
]


def _stage_settings(stage: str) -> dict:
    settings = dict(STAGES[stage])
    for param in ROWS:
        row_stage, row_settings, _ = param.values
        if row_stage == stage:
            settings.update(row_settings)
    return settings


def test_rows_of_a_stage_do_not_overlap():
    """Each row's variables are its own within its stage's single run (no container needed)."""
    for stage in STAGES:
        seen: dict[str, str] = {}
        for param in ROWS:
            row_stage, row_settings, _ = param.values
            if row_stage != stage:
                continue
            for name in row_settings:
                assert name not in seen and name not in STAGES[stage], (stage, name, seen.get(name), param.id)
                seen[name] = param.id
    assert len([p for p in ROWS if not p.id.startswith(("stack-spec", "injection"))]) >= 20


@pytest.fixture(scope="module")
def stage_run(focal_host, tmp_path_factory, catalog):
    """One site.yml run per stage (all its rows' settings at once), cached: (before, run, after)."""
    runs: dict[str, tuple] = {}

    def run(stage: str):
        if stage not in runs:
            inventory = sandbox.write_inventory(
                tmp_path_factory.mktemp(f"role-settings-{stage}") / "inventory.yml",
                [focal_host.name],
                {
                    "stack_artifact_checksums": {name: "ab" * 32 for name in unpinned_files(catalog)},
                    "stack_artifact_cache_dir": "",
                    **_stage_settings(stage),
                },
            )
            before = focal_host.fingerprint()
            result = run_playbook("site.yml", inventory)
            runs[stage] = (before, result, focal_host.fingerprint())
        return runs[stage]

    return run


@pytest.mark.parametrize(("stage", "settings", "expected"), ROWS)
def test_role_setting_is_refused_before_any_role_runs(stage_run, focal_host, stage, settings, expected):
    before, result, after = stage_run(stage)
    assert result.rc != 0, result.output[-3000:]
    flat = " ".join(result.output.split())
    for text in expected:
        assert " ".join(text.split()) in flat, f"{text!r} not in output:\n{result.output[-5000:]}"
    # One short line per setting: no argument-spec dump, no empty choice listed as ", ".
    assert "argument_spec_data" not in flat and "Validation of arguments failed" not in flat
    assert "must be one of: ," not in flat
    assert "secret" not in flat  # a password in an index URL is never printed
    ran = [role for role in ROLES if f"TASK [{role} :" in result.output]
    assert not ran, f"tasks of {ran} ran:\n{result.output[-3000:]}"
    if stage in CONTROLLER_STAGES:
        assert "Gather the facts the checks need" not in result.output
    assert focal_host.sh("test -e /msgpu-pwned").returncode != 0, "the quoted setting ran a command on the host"
    assert after == before
