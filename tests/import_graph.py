"""The import graph of a Python package read from its source with `ast` (imports inside functions included), and
its circles: for the tests that hold the verification package (test_import_graph.py) and the test bed
(test_testbed_imports.py) free of import circles."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set


def module_files(package: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every .py file of ``package`` (a package is its __init__.py)."""
    found: Dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The package's modules that ``path`` (module ``name``) imports anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                target = next(
                    (".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None
                )
                if target:
                    edges.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    edges.add(f"{source}.{alias.name}")
                elif source in modules:
                    edges.add(source)
    edges.discard(name)
    return edges


def import_graph(package: Path) -> Dict[str, Set[str]]:
    modules = module_files(package)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Each import circle found by a depth-first walk, as the modules along it (first one repeated at the end)."""
    found: List[List[str]] = []
    state: Dict[str, str] = {}  # "open" while on the walk's path, "done" after
    path: List[str] = []

    def walk(node: str) -> None:
        state[node] = "open"
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                walk(target)
        state[node] = "done"
        path.pop()

    for node in sorted(edges):
        if node not in state:
            walk(node)
    return found


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle as [a, b, ..., a], or None."""
    found = cycles(graph)
    return found[0] if found else None
