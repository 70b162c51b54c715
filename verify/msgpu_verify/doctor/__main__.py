"""``python -m msgpu_verify.doctor ...``, and the doctor's folder run as a file: ``python3 <folder>/doctor ...`` (or
``python3 <folder>/doctor/__main__.py ...``) with the distribution's Python and no PYTHONPATH.

Run as a file, it imports its own folder as a package by path (no folder is put on sys.path): inside a msgpu_verify
folder (the verify role copies PROBE_FILES beside it) as that package's ``doctor``, so that the GPU probe and the
GPU code rule find judge.py and compute.py; copied alone as a package of its own, which runs without them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _package(name: str, folder: Path) -> ModuleType:
    """The package in ``folder`` (its __init__.py), imported by path as ``name``."""
    spec = importlib.util.spec_from_file_location(
        name, str(folder / "__init__.py"), submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None, folder
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _cli() -> ModuleType:
    """The doctor's cli module: relative to this one in the package, else its folder's, imported by path."""
    if __package__:
        return importlib.import_module(".cli", __package__)
    folder = Path(__file__).resolve().parent
    # Python put this folder first on sys.path: its modules are the doctor's, never top-level ones.
    if sys.path and Path(sys.path[0] or ".").resolve() == folder:
        del sys.path[0]
    if (folder.parent / "__init__.py").is_file():
        _package(folder.parent.name, folder.parent)
        return importlib.import_module(f"{folder.parent.name}.{folder.name}.cli")
    _package("doctor", folder)
    return importlib.import_module("doctor.cli")


if __name__ == "__main__":
    sys.exit(_cli().main())
