"""Shared test helpers: the project root on sys.path, the catalog and the resolver."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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
    """Files the catalog has no publisher checksum for (NVIDIA's runfiles and tarballs)."""
    return [artifact["file"] for artifact in catalog_artifacts(catalog) if artifact["sha256"] is None]


@pytest.fixture(scope="session")
def pinned(catalog) -> dict[str, str]:
    """Stand-in checksums for every unpinned file: the resolver only checks their form."""
    return {name: "ab" * 32 for name in unpinned_files(catalog)}
