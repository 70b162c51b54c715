"""What ships does not stand on what tests (issue 41 part 4): the operator's code imports nothing of the test bed
(testbed/) or the tests (tests/), except through one small, named seam.

- The shipped verification package (verify/msgpu_verify), the roles' Python (filter plugins, host scripts) and
  tasks.py import neither, at any level.
- The CLI reaches the test bed only through cli/local.py (the sandbox host and the fixture mirror for commands
  run without an inventory), and only inside its functions, so loading the CLI loads none of it; cli/checks.py,
  the test command itself, is the one other module that runs it.
- catalog/tools (maintainer tools) import the test bed only inside a function (gpu_ids.py --archive).

Imports are read with `ast`, function-level ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_CODE = ("testbed", "tests")
# The seam, and the test command.
CLI_ALLOWED = {"cli/local.py", "cli/checks.py"}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, id(node) in top))
    return found


def _test_code(module: str) -> bool:
    return module.split(".")[0] in TEST_CODE


def _files(*patterns: str) -> list[Path]:
    return sorted(p for pattern in patterns for p in ROOT.glob(pattern) if "__pycache__" not in p.parts)


SHIPPED = _files("verify/msgpu_verify/**/*.py", "roles/*/filter_plugins/*.py", "roles/*/files/*.py", "tasks.py")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_code_imports_no_test_code(path):
    bad = [module for module, _ in _imports(path) if _test_code(module)]
    assert not bad, f"{path.relative_to(ROOT)} imports test code: {bad}"


@pytest.mark.parametrize("path", _files("cli/*.py"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_cli_reaches_the_test_bed_only_through_its_seam(path):
    name = str(path.relative_to(ROOT))
    imports = [(module, top) for module, top in _imports(path) if _test_code(module)]
    if name in CLI_ALLOWED:
        assert not [m for m, top in imports if top], f"{name} imports the test bed when it loads: {imports}"
    else:
        assert not imports, f"{name} imports the test bed (go through cli/local.py): {[m for m, _ in imports]}"


@pytest.mark.parametrize("path", _files("catalog/tools/*.py"), ids=lambda p: str(p.relative_to(ROOT)))
def test_maintainer_tools_load_without_the_test_bed(path):
    bad = [module for module, top in _imports(path) if _test_code(module) and top]
    assert not bad, f"{path.relative_to(ROOT)} imports the test bed when it loads: {bad}"


def test_the_check_sees_a_function_level_import(tmp_path):
    """Not vacuous: an import inside a function counts."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from testbed import sandbox\n")
    assert _imports(sample) == [("testbed", False)]
