"""The test bed's stacks: the catalog, the stack role's resolver, and the settings of each molecule scenario's
stack (SCENARIO_VARS) with what the test bed's hosts install from them (installed_artifacts).

The settings that name versions are derived from the catalog through the resolver's public helpers
(roles/stack/filter_plugins/stack_catalog.py), so a new catalog entry moves them with it. The fixtures
(testbed/fixtures.py: build_mirror builds what the hosts install) and the scenarios (testbed/scenarios.py: the
hosts' group vars, the suite's stages) both read them here.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from testbed import files

CATALOG_FILE = files.ROOT / "catalog" / "stacks.yml"


def load_catalog(path: Path = CATALOG_FILE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


class ScenarioError(RuntimeError):
    """The test bed cannot be set up (the message says why)."""


def load_role_file(name: str, relative: str):
    """A Python file of a role (a file, not a package) as a module, without writing its bytecode into the role
    (a __pycache__ folder in roles/<role>/files would be shipped and scanned as one of the role's files)."""
    spec = importlib.util.spec_from_file_location(name, files.ROOT / "roles" / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module


# The resolver the `stack` role uses as its filter plugin.
stack_catalog = load_role_file("stack_catalog", "stack/filter_plugins/stack_catalog.py")
CATALOG = load_catalog()
DEFAULT_STACK = CATALOG["stacks"][CATALOG["default_stack"]]


def wheel_overrides() -> dict:
    """For each of cuDNN and NCCL, the version the default stack accepts that has a `wheel`
    artifact in the catalog (versions live only there)."""
    overrides: dict = {}
    for component in ("cudnn", "nccl"):
        version = stack_catalog.accepted_versions(CATALOG, component, method="wheel")[0]
        overrides.update({f"stack_{component}_version": version, f"stack_{component}_method": "wheel"})
    return overrides


def seed_nccl() -> dict:
    """The seed's NCCL, the tarball the default stack accepts (2.8.4; a fixture here). The stack's own
    default is NCCL's PyPI wheel (the tarball has no public checksum); the wheels scenario runs that."""
    version = next(
        v
        for v in stack_catalog.accepted_versions(CATALOG, "nccl", method="tarball")
        if f"+cuda{DEFAULT_STACK['cuda']}_" in CATALOG["nccl"][v]["tarball"]["file"]
    )
    return {"stack_nccl_version": version, "stack_nccl_method": "tarball"}


def second_cuda() -> list[str]:
    """A second CUDA toolkit for side-by-side tests: the newest catalog CUDA other than the default
    stack's that the stack's driver branch can run."""
    driver = CATALOG["driver"][DEFAULT_STACK["driver_branch"]]["version"]
    fits = stack_catalog.cuda_versions_for_driver(CATALOG, driver)
    return [v for v in fits if v != DEFAULT_STACK["cuda"]][-1:]


def installed_artifacts(catalog: dict, fixture_files: Iterable[str]) -> set[str]:
    """What the test bed's hosts install from the fixture mirror: the file names of the runfiles and
    tarballs, and `name` or `name=version` of the cuda_repo packages, of each scenario's stack over the
    sandbox hosts' seed NCCL (the fault, fleet, preflight and system tests install these stacks too).
    build_mirror builds the fixtures of these (testbed/fixtures.py); the fixtures' own contract tests
    build the others the catalog names (the CUDA 11.6 runfile, cuDNN 8.5's archive, NCCL 2.14.3's tarball, the
    CUDA 11.6, cuDNN 8.5 and NCCL 2.14.3 packages: about 4.2 GB none of the suite's hosts installs).
    `fixture_files`: the file names of the catalog's fixtures (fixtures.plan), each pinned here with a dummy
    sha256 (the resolver lists only pinned downloads)."""
    unpinned = {name: "0" * 64 for name in fixture_files}
    wanted: set[str] = set()

    def packages(node: object) -> None:
        if isinstance(node, dict):
            wanted.update(p for p in node.get("packages", []) if isinstance(p, str))
            for value in node.values():
                packages(value)
        elif isinstance(node, list):
            for value in node:
                packages(value)

    for settings in SCENARIO_VARS.values():
        merged = {**seed_nccl(), **settings}
        stack_settings = {k.removeprefix("stack_"): v for k, v in merged.items() if k.startswith("stack_")}
        resolved = stack_catalog.resolve_stack(
            catalog, {"artifact_checksums": unpinned, "artifact_cache_dir": "/cache", **stack_settings}
        )
        if resolved["errors"]:
            raise ScenarioError(f"the test bed's stacks do not resolve: {resolved['errors']}")
        stack = resolved["stack"]
        wanted.update(d["file"] for d in stack.get("artifact_cache", {}).get("downloads", []))
        packages(stack)
    # A package the stack pins (libcudnn8=8.0.5.39-1+cuda11.1) is also listed by bare name (to hold it).
    pinned = {spec.partition("=")[0] for spec in wanted if "=" in spec}
    return wanted - pinned


SCENARIO_VARS: dict[str, dict] = {
    # The seed's stack with TensorRT (for MindSpore Serving) by the stack's default method, tarball.
    "default": {"stack_tensorrt_enabled": True},
    "runfile": {"stack_driver_method": "runfile", "stack_cuda_extra_versions": second_cuda()},
    "nvidia_repo": {
        **{f"stack_{c}_method": "cuda_repo" for c in ("driver", "cuda", "cudnn", "nccl")},
        "stack_cuda_extra_versions": second_cuda(),
    },
    "wheels": {
        **wheel_overrides(),
        # TensorRT from NVIDIA's nvidia-tensorrt wheel: the version the default stack accepts that has one.
        "stack_tensorrt_enabled": True,
        "stack_tensorrt_method": "wheel",
        "stack_tensorrt_version": stack_catalog.accepted_versions(CATALOG, "tensorrt", method="wheel")[0],
        # A site's own virtualenv path: MindSpore goes there, and TensorRT's wheel after it (the stack publishes
        # the path once; verify/testinfra/test_tensorrt.py checks tensorrt imports from it).
        "mindspore_venv": "/opt/msgpu/venvs/mindspore",
    },
}
