"""Shared test helpers: the project root on sys.path, the catalog and the resolver."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs on this machine; a zombie (only waiting for its parent to reap it)
    counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def controller_playbook(tmp_path: Path, playbook: str, hosts: dict, *args: str):
    """ansible-playbook with the project's ansible.cfg on `hosts` (inventory host vars) in group gpu_servers, run
    from the repository root on the controller; the completed process."""
    import subprocess
    import sys

    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_servers": {"hosts": hosts}}}}))
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), playbook, *args]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def catalog() -> dict:
    return yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())


@pytest.fixture(scope="session")
def stack_catalog():
    """The resolver the `stack` role uses as its filter plugin."""
    return load_module("stack_catalog", ROOT / "roles" / "stack" / "filter_plugins" / "stack_catalog.py")


def catalog_artifacts(catalog: dict) -> list[dict]:
    """Every artifact entry in the catalog (a mapping with a `file`), wherever it sits."""
    found: list[dict] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if "file" in node and "sha256" in node:
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(catalog)
    return found


def unpinned_files(catalog: dict) -> list[str]:
    """Files no public source gives a checksum for (`sha256: null` with `no_public_checksum`: NCCL's
    and TensorRT 7's tarballs, the vendor's MindSpore and Serving wheels). Every other file carries
    its real sha256, so tests give stand-ins only for these."""
    return [artifact["file"] for artifact in catalog_artifacts(catalog) if artifact["sha256"] is None]


@pytest.fixture(scope="session")
def pinned(catalog) -> dict[str, str]:
    """Stand-in checksums for every unpinned file: the resolver only checks their form."""
    return {name: "ab" * 32 for name in unpinned_files(catalog)}


# Settings the resolver must refuse, each with the variable its message must name and what it must
# say is allowed. The unit tests run them through the resolver; the integration tests through
# site.yml against a real container, proving the host did not change.
RESOLVER_REFUSALS = [
    pytest.param(
        {"name": "ms9.9-cuda99"},
        "stack_name",
        "ms1.5-cuda11.1, ms1.10-cuda11.1, ms2.0-cuda11.1, ms2.2-cuda11.6",
        id="name-0",
    ),
    pytest.param(
        {"mindspore_version": "1.7.0"},
        "stack_mindspore_version",
        "allowed: 1.5.1, 1.5.0, 1.10.0, 2.0.0, 2.2.14",
        id="mindspore_version-1",
    ),
    pytest.param(
        {"mindspore_version": "2.2.14"}, "stack_mindspore_version", "allowed: 1.5.1, 1.5.0", id="mindspore_version-2"
    ),
    pytest.param({"cuda_version": "11.6"}, "stack_cuda_version", "allowed: 11.1", id="cuda_version-3"),
    pytest.param({"cudnn_version": "7.6.5"}, "stack_cudnn_version", "allowed: 8.0.5, 8.5.0", id="cudnn_version-4"),
    pytest.param(
        {"name": "ms2.2-cuda11.6", "cudnn_version": "8.0.5"},
        "stack_cudnn_version",
        "allowed: 8.5.0",
        id="cudnn_version-5",
    ),
    pytest.param({"nccl_version": "2.3.7"}, "stack_nccl_version", "allowed: 2.8.4, 2.14.3", id="nccl_version-6"),
    pytest.param(
        {"driver_branch": "390"},
        "stack_driver_branch",
        "allowed: 470, 510, 525, 535, 570, or 'auto'",
        id="driver_branch-7",
    ),
    pytest.param(
        {"name": "ms2.2-cuda11.6", "driver_branch": "470"},
        "stack_driver_branch",
        "allowed: 510, 525, 535, 570",
        id="driver_branch-8",
    ),
    pytest.param(
        {"cuda_extra_versions": ["11.6"]}, "stack_driver_branch", "allowed: 510, 525, 535, 570", id="driver_branch-9"
    ),
    # focal's 510/525 packages are transitional packages that install 535: refused for what they are.
    pytest.param({"driver_branch": "525"}, "stack_driver_method", "allowed for it: runfile, cuda_repo", id="driver-10"),
    pytest.param(
        {"cuda_extra_versions": ["12.4"]},
        "stack_cuda_extra_versions",
        "allowed: 11.1, 11.4, 11.6",
        id="cuda_extra_versions-10",
    ),
    pytest.param(
        {"cuda_extra_versions": "11.6"}, "stack_cuda_extra_versions", "must be a list", id="cuda_extra_versions-11"
    ),
    pytest.param(
        {"cudnn_method": "wheel"},
        "stack_cudnn_method",
        "allowed for it: tarball, cuda_repo (or a cuDNN version",
        id="cudnn_method-12",
    ),
    pytest.param(
        {"cudnn_method": "conda"}, "stack_cudnn_method", "allowed: tarball, cuda_repo, wheel", id="cudnn_method-13"
    ),
    pytest.param(
        {"nccl_method": "pip"}, "stack_nccl_method", "allowed: tarball, cuda_repo, wheel", id="nccl_method-14"
    ),
    pytest.param({"cuda_method": "wheel"}, "stack_cuda_method", "allowed: runfile, cuda_repo", id="cuda_method-15"),
    pytest.param(
        {"driver_method": "runfile", "driver_version": "470.57.02"},
        "stack_driver_version",
        "no runfile for driver 470.57.02 in branch 470; allowed: 470.86",
        id="driver_version-16",
    ),
    pytest.param(
        {"tensorrt_enabled": True, "tensorrt_method": "wheel"},
        "stack_tensorrt_method",
        "TensorRT 7.2.2.3 has no 'wheel' artifact; allowed for it: tarball",
        id="tensorrt_method-17",
    ),
    pytest.param(
        {"tensorrt_enabled": "yes"}, "stack_tensorrt_enabled", "allowed: true, false", id="tensorrt_enabled-18"
    ),
    pytest.param({"sources": {"nvidia": "http://x"}}, "stack_sources", "allowed: mindspore_release", id="sources-19"),
    pytest.param(
        {"sources": {"pypi": "pypi.example.org"}},
        "stack_sources.pypi",
        "http://, https:// or file://",
        id="sources.pypi-20",
    ),
    pytest.param(
        {"artifact_checksums": {"a.run": "md5:123"}},
        "stack_artifact_checksums.a.run",
        "64 hexadecimal",
        id="artifact_checksums.a.run-21",
    ),
    pytest.param(
        {"local_artifacts": {"a.tgz": "/nonexistent/a.tgz"}},
        "stack_local_artifacts.a.tgz",
        "does not exist",
        id="local_artifacts.a.tgz-22",
    ),
    # Representatives of the refusals of issue 14 (each row here is also a site.yml run in the
    # integration tests); tests/unit/test_stack_catalog.py has every case with its exact message.
    pytest.param(
        {"cuda_version": 11.1},  # the inventory's unquoted 11.10: a float
        "stack_cuda_version",
        "11.1 is a number (YAML reads 11.10 as 11.1); allowed: a version in quotes",
        id="cuda_version-23",
    ),
    pytest.param(
        {"cuda_extra_versions": ["11.4", "11.4"]},
        "stack_cuda_extra_versions",
        "listed more than once; allowed: each version once",
        id="cuda_extra_versions-24",
    ),
    pytest.param(
        {"driver_version": "470.86"},
        "stack_driver_version",
        "allowed: '' (the default), or stack_driver_method: runfile",
        id="driver_version-25",
    ),
]
