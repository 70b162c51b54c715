"""The verification package's modules import each other without a cycle.

Every ``import`` and ``from ... import`` between msgpu_verify's modules counts, at module level and inside
functions alike (a function-level import that only holds a cycle open is still a cycle), read with ``ast``:
``from P import n`` is an edge to the module P.n where there is one, else to P; ``import a.b`` to a.b. Imports by
name at run time (importlib.import_module: the doctor's GPU rules reach judge.py and compute.py so) are not seen.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE = Path(__file__).resolve().parents[2] / "verify" / "msgpu_verify"


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


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle as [a, b, ..., a], or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_msgpu_verify_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    # The reader sees the package's own imports of every kind (relative, absolute, module and function level).
    assert "msgpu_verify.doctor" in graph["msgpu_verify.__main__"]
    assert "msgpu_verify.doctor.core" in graph["msgpu_verify.doctor.kernel"]
    assert "msgpu_verify.lenet" in graph["msgpu_verify.bench"]  # inside train_child (it imports MindSpore)
    assert "msgpu_verify.mnist" in graph["msgpu_verify.seed_main"]  # `from msgpu_verify import mnist`
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_held_open_by_a_function_level_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("from .b import run\n")
    (package / "sub" / "b.py").write_text("def run():\n    from ..a import something\n    return something\n")
    (package / "c.py").write_text("import pkg.a\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (package / "sub" / "b.py").write_text("def run():\n    return 1\n")
    assert find_cycle(import_graph(package)) is None
