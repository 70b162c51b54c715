"""The verification package's modules import each other without a cycle.

Every ``import`` and ``from ... import`` between msgpu_verify's modules counts, at module level and inside
functions alike (a function-level import that only holds a cycle open is still a cycle), read with ``ast``:
``from P import n`` is an edge to the module P.n where there is one, else to P; ``import a.b`` to a.b. Imports by
name at run time (importlib.import_module: the doctor's GPU rules reach judge.py and compute.py so) are not seen.
"""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import find_cycle, import_graph

PACKAGE = Path(__file__).resolve().parents[2] / "verify" / "msgpu_verify"


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
