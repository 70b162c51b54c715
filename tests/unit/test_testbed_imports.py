"""The test bed's modules (testbed/*.py) import each other without a circle, and at module level: a function-level
import is how a circle stays hidden (it works until someone moves it up). The graph is read from the source with
`ast`, imports inside functions included. Not counted: the fixture builders fixtures.build_mirror looks up by
name at run time (fixtures.EXTRA_BUILDERS: plugins built on fixtures, which never imports them)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT
from tests.import_graph import cycles, import_graph

TESTBED = ROOT / "testbed"
PACKAGE = "testbed"


def modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(TESTBED.glob("*.py")) if path.stem != "__init__"}


def imports(path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """The test bed modules `path` imports: (module, line, whether the import is inside a function or class)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name.split(".")[1] for a in child.names if a.name.startswith(PACKAGE + ".")]
            elif isinstance(child, ast.ImportFrom):
                # A relative import (from . import x, from .x import y) is inside the package.
                module = ".".join(filter(None, [PACKAGE, child.module])) if child.level else child.module or ""
                if module == PACKAGE:
                    names = [a.name for a in child.names]  # from testbed import x, y
                elif module.startswith(PACKAGE + "."):
                    names = [module.split(".")[1]]  # from testbed.x import y
            found.extend((name, child.lineno, nested) for name in names if name in known)
            visit(child, inner)

    visit(tree, False)
    return found


def graph() -> dict[str, set[str]]:
    """The test bed's modules (short names) and the test bed modules each imports (tests/import_graph.py)."""
    edges = import_graph(TESTBED)
    short = {name: name.removeprefix(PACKAGE + ".") for name in edges if name != PACKAGE}
    return {short[name]: {short[t] for t in targets if t in short} for name, targets in edges.items() if name in short}


def test_the_graph_sees_the_imports_it_should():
    """The reader finds the known imports of each kind (a reader that finds none would pass any tree)."""
    edges = graph()
    assert {"fixtures", "sandbox", "stacks", "suite", "mirror"} <= edges["scenarios"]
    assert {"files", "stacks"} <= edges["fixtures"]
    assert edges["files"] == set()


def test_the_test_bed_has_no_import_circle():
    found = cycles(graph())
    assert not found, "import circles in testbed/: " + "; ".join(" -> ".join(c) for c in found)


def test_the_test_bed_modules_import_each_other_at_module_level():
    known = set(modules())
    nested = [
        f"testbed/{path.name}:{line} imports {target} inside a function"
        for path in modules().values()
        for target, line, inner in imports(path, known)
        if inner
    ]
    assert not nested, nested


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
