"""What the host should look like, from the stack catalog and the host's own settings.

Works with any testinfra backend: with `ansible://` (and molecule) the stack_* settings come
from the inventory; with `docker://`, `ssh://` or `local://` the catalog's defaults apply, or
the MSGPU_STACK_SETTINGS environment variable (JSON of stack_* settings).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())


def _resolver():
    path = ROOT / "roles" / "stack" / "filter_plugins" / "stack_catalog.py"
    spec = importlib.util.spec_from_file_location("stack_catalog", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def settings_for(host) -> dict:
    """The host's stack_* variables, without the prefix."""
    variables: dict = {}
    if host.backend.NAME == "ansible":
        variables = host.ansible.get_variables()
    variables.update(json.loads(os.environ.get("MSGPU_STACK_SETTINGS", "{}")))
    return {k.removeprefix("stack_"): v for k, v in variables.items() if k.startswith("stack_")}


@pytest.fixture(scope="module")
def host_vars(host) -> dict:
    """The host's inventory variables (empty without the ansible backend)."""
    return host.ansible.get_variables() if host.backend.NAME == "ansible" else {}


@pytest.fixture(scope="module")
def settings(host) -> dict:
    return settings_for(host)


@pytest.fixture(scope="module")
def stack(settings) -> dict:
    result = _resolver().resolve_stack(CATALOG, settings)
    # Verifying downloads nothing, so unpinned NVIDIA files do not matter here.
    errors = [e for e in result["errors"] if not e.startswith("stack_artifact_checksums.")]
    assert not errors, errors
    return result["stack"]


@pytest.fixture(scope="module")
def platform(host) -> str:
    info = host.system_info
    return f"{info.distribution}-{info.release}"


@pytest.fixture(scope="module")
def python_path(settings) -> str:
    return settings.get("python") or "/usr/bin/python3"
