"""What the REAL MindSpore wheels say and offer, recorded for the unit tests: tests/unit/data/run_check_texts.json.

The verification package runs on hosts where MindSpore is installed; the controller and CI have no MindSpore. Two
things it depends on differ between the releases the catalog supports, and both are read here from the wheels
themselves, never from memory:

* ``mindspore.run_check()``'s own words (judge.py decides OK or FAILED from them): the ``print`` calls of
  ``mindspore/run_check/run_check.py``, as templates (``{ms.get_context('device_target')}`` where the wheel formats
  a value in), sorted into the success text (the last print of ``_check_mul``) and the failure texts (the prints in
  ``run_check``'s ``except`` handlers).
* the MindSpore names the verification package uses (``ms.set_context`` exists in 2.x, not in 1.5): for every
  ``mindspore`` module that verify/msgpu_verify/*.py reaches (``import mindspore as ms; ms.context.set_context``,
  ``from mindspore.context import ParallelMode`` ...), the names that module binds, read statically (``import``,
  ``from X import *`` through ``__all__``, ``def``, ``class``, assignments; submodules count as attributes).

For every MindSpore release of the catalog whose wheel is on PyPI, the wheel is taken from the artifact cache or the
wheel cache (``.cache/run_check/wheels``), else downloaded once with ``pip download --no-deps`` (hundreds of MB each:
never in the unit tests). Only the members read are extracted, to ``.cache/run_check/<version>/files/`` with the
wheel's sha256 and list of modules beside them; from the extract the record is derived again without the wheel, so
the unit test re-derives the committed file whenever the extract is there. A release whose wheel PyPI does not carry
(2.2.14: only on the vendor's server) is recorded as such, with PyPI's nearest releases around it read instead
(``bracketed_by``), so the tests can show its texts cannot differ from both neighbours'.

    python -m testbed.run_check_texts            # fetch what is missing, extract, (re)write the data file
    python -m testbed.run_check_texts --check    # re-derive from the extracts only; exit 1 if the file differs
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from testbed.files import sha256_file

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "catalog" / "stacks.yml"
CACHE = ROOT / ".cache"
EXTRACTS = CACHE / "run_check"
WHEELS = EXTRACTS / "wheels"
ARTIFACT_CACHE = CACHE / "artifact-cache"
DATA_FILE = ROOT / "tests" / "unit" / "data" / "run_check_texts.json"
VERIFY = ROOT / "verify" / "msgpu_verify"
RUN_CHECK_MODULE = "mindspore/run_check/run_check.py"
SOURCE = "source.json"
MODULE_LIST = "modules.txt"
DERIVED = "derived.json"
# The Python tags tried, the tested platform's first (Ubuntu 20.04: 3.8); the modules read are pure Python, the
# same in every tag's wheel of one release.
PYTHON_TAGS = ("cp38", "cp39", "cp37")
FORMAT = 1


def log(message: str) -> None:
    print(f"[run_check_texts] {message}", file=sys.stderr, flush=True)


# --- a wheel, or its extract -----------------------------------------------------------------------------


class Tree:
    """The ``mindspore/`` members of one wheel: read from the wheel (recording what is read) or from its extract."""

    def __init__(self, wheel: Optional[Path] = None, extract: Optional[Path] = None) -> None:
        self.wheel = zipfile.ZipFile(wheel) if wheel else None
        self.extract = extract
        self.read_members: Set[str] = set()
        if self.wheel is not None:
            names = self.wheel.namelist()
        else:
            assert extract is not None
            names = (extract / MODULE_LIST).read_text().split()
        self.members = {n for n in names if n.startswith("mindspore/") and n.endswith(".py")}
        self.modules: Dict[str, str] = {}  # dotted module -> member
        for member in self.members:
            dotted = member[: -len(".py")].replace("/", ".")
            if dotted.endswith(".__init__"):
                dotted = dotted[: -len(".__init__")]
            self.modules[dotted] = member

    def source(self, member: str) -> str:
        self.read_members.add(member)
        if self.wheel is not None:
            return self.wheel.read(member).decode("utf-8")
        assert self.extract is not None
        return (self.extract / "files" / member).read_text(encoding="utf-8")

    def is_package(self, dotted: str) -> bool:
        return self.modules.get(dotted, "").endswith("/__init__.py")

    def write_extract(self, folder: Path, source: Dict[str, Any]) -> None:
        """The members read so far, the module list and where they came from, under ``folder``."""
        assert self.wheel is not None
        for member in sorted(self.read_members):
            target = folder / "files" / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.wheel.read(member))
        (folder / MODULE_LIST).write_text("\n".join(sorted(self.members)) + "\n")
        (folder / SOURCE).write_text(json.dumps(source, indent=1, sort_keys=True) + "\n")


# --- run_check's texts ------------------------------------------------------------------------------------


def template(node: ast.expr, source: str) -> str:
    """A printed argument as text: constants as they are, formatted values as ``{expression}``."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                assert isinstance(value, ast.FormattedValue)
                parts.append("{" + (ast.get_source_segment(source, value.value) or "?") + "}")
        return "".join(parts)
    return "{" + (ast.get_source_segment(source, node) or "?") + "}"


def print_template(call: ast.Call, source: str) -> str:
    """What ``print(a, b, ...)`` writes (its default sep is one space)."""
    return " ".join(template(arg, source) for arg in call.args)


def _prints(nodes: List[ast.stmt], source: str) -> List[str]:
    found = []
    for statement in nodes:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                found.append(print_template(node, source))
    return found


def run_check_texts(tree: Tree) -> Dict[str, Any]:
    source = tree.source(RUN_CHECK_MODULE)
    module = ast.parse(source)
    functions = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    check_mul = _prints(functions["_check_mul"].body, source)
    handlers = [node for node in ast.walk(functions["run_check"]) if isinstance(node, ast.ExceptHandler)]
    failure = [text for handler in handlers for text in _prints(handler.body, source)]
    return {
        "module": RUN_CHECK_MODULE,
        "module_sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
        "prints": _prints(module.body, source),
        "success": check_mul[-1],
        "failure": failure,
    }


# --- the names the verification package uses --------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """One use of a MindSpore name in verify/msgpu_verify: ``module`` must exist, ``chain`` resolve inside it."""

    file: str
    line: int
    module: str
    chain: Tuple[str, ...]

    def text(self) -> str:
        return ".".join((self.module, *self.chain))


def _chain(node: ast.AST) -> Optional[Tuple[str, List[str]]]:
    attrs: List[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, list(reversed(attrs))
    return None


def _imports_mindspore(value: ast.AST) -> bool:
    """``__import__("mindspore")`` anywhere in an expression (probe.py binds ``ms`` that way)."""
    return any(
        isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "__import__"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "mindspore"
        for node in ast.walk(value)
    )


def references(folder: Path = VERIFY) -> List[Reference]:
    """Every ``mindspore`` module imported and every attribute chain read from one, in verify/msgpu_verify."""
    found: List[Reference] = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        # local name -> (mindspore module, names below it); per file, where each name has one meaning
        aliases: Dict[str, Tuple[str, Tuple[str, ...]]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "mindspore":
                        found.append(Reference(path.name, node.lineno, alias.name, ()))
                        if alias.asname:
                            aliases[alias.asname] = (alias.name, ())
                        else:
                            aliases["mindspore"] = ("mindspore", ())
            elif isinstance(node, ast.ImportFrom) and not node.level:
                module = node.module or ""
                if module.split(".")[0] != "mindspore":
                    continue
                found.append(Reference(path.name, node.lineno, module, ()))
                for alias in node.names:
                    found.append(Reference(path.name, node.lineno, module, (alias.name,)))
                    aliases[alias.asname or alias.name] = (module, (alias.name,))
            elif isinstance(node, ast.Assign) and _imports_mindspore(node.value):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        aliases[target.id] = ("mindspore", ())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                chain = _chain(node)
                if chain and chain[0] in aliases:
                    module, base = aliases[chain[0]]
                    found.append(Reference(path.name, node.lineno, module, (*base, *chain[1])))
    # Keep the longest chains only (ms.context.set_context covers ms.context), each once per file.
    texts = {r.text() for r in found}
    kept: Dict[Tuple[str, str, Tuple[str, ...]], Reference] = {}
    for ref in sorted(found, key=lambda r: (r.file, r.line)):
        if ref.chain and any(t.startswith(ref.text() + ".") for t in texts):
            continue
        kept.setdefault((ref.file, ref.module, ref.chain), ref)
    return list(kept.values())


class Api:
    """The names each module of one MindSpore wheel binds, read statically."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self._bound: Dict[str, Dict[str, Optional[str]]] = {}
        self._all: Dict[str, Optional[List[str]]] = {}
        self._busy: Set[str] = set()
        self._parsed: Dict[str, ast.Module] = {}

    def exists(self, dotted: str) -> bool:
        return dotted in self.tree.modules

    def _parse(self, dotted: str) -> ast.Module:
        if dotted not in self._parsed:
            self._parsed[dotted] = ast.parse(self.tree.source(self.tree.modules[dotted]))
        return self._parsed[dotted]

    def _absolute(self, dotted: str, module: Optional[str], level: int) -> str:
        if not level:
            return module or ""
        base = dotted if self.tree.is_package(dotted) else dotted.rpartition(".")[0]
        for _ in range(level - 1):
            base = base.rpartition(".")[0]
        return f"{base}.{module}" if module else base

    def bound(self, dotted: str) -> Dict[str, Optional[str]]:
        """Name -> the module it refers to (None: not a module) for every name ``dotted`` binds at module level."""
        if dotted in self._bound:
            return self._bound[dotted]
        if dotted in self._busy or not self.exists(dotted):
            return {}
        self._busy.add(dotted)
        names: Dict[str, Optional[str]] = {}
        prefix = dotted + "."
        for child in self.tree.modules:
            if child.startswith(prefix) and "." not in child[len(prefix) :]:
                names[child[len(prefix) :]] = child
        for statement in self._statements(self._parse(dotted).body):
            self._bind(dotted, statement, names)
        self._busy.discard(dotted)
        self._bound[dotted] = names
        return names

    def _statements(self, body: List[ast.stmt]) -> Iterator[ast.stmt]:
        """Module-level statements, including those under if/try/with (either branch may run)."""
        for statement in body:
            yield statement
            for field in ("body", "orelse", "finalbody"):
                if isinstance(statement, (ast.If, ast.Try, ast.With)) and getattr(statement, field, None):
                    yield from self._statements(getattr(statement, field))
            if isinstance(statement, ast.Try):
                for handler in statement.handlers:
                    yield from self._statements(handler.body)

    def _bind(self, dotted: str, statement: ast.stmt, names: Dict[str, Optional[str]]) -> None:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname:
                    names[alias.asname] = alias.name if self.exists(alias.name) else None
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top if self.exists(top) else None
        elif isinstance(statement, ast.ImportFrom):
            source = self._absolute(dotted, statement.module, statement.level)
            for alias in statement.names:
                if alias.name == "*":
                    exported = self.bound(source)
                    for name in self.star_names(source):
                        names[name] = exported.get(name)
                    continue
                # The package's own binding wins over a submodule of the same name (1.5's
                # `from .run_check import run_check` binds the function); a package still being read offers its
                # submodules only.
                child = f"{source}.{alias.name}"
                exported = self.bound(source)
                target = exported[alias.name] if alias.name in exported else (child if self.exists(child) else None)
                names[alias.asname or alias.name] = target
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[statement.name] = None
        elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name) and node.id not in names:
                        names[node.id] = None

    def star_names(self, dotted: str) -> List[str]:
        """What ``from dotted import *`` binds: its ``__all__`` when that can be read, else its public names."""
        declared = self.all_names(dotted)
        if declared is not None:
            return declared
        return [name for name in self.bound(dotted) if not name.startswith("_")]

    def all_names(self, dotted: str) -> Optional[List[str]]:
        """``__all__`` as the module builds it: list literals, other modules' ``__all__``, module-level lists of
        names (1.5's ``__all__.extend(__dtype__)``), ``+``, ``+=``, ``extend``, ``append``."""
        if dotted in self._all:
            return self._all[dotted]
        if not self.exists(dotted):
            return None
        self._all[dotted] = None  # a cycle reads as "unknown"
        bound = self.bound(dotted)
        lists: Dict[str, Optional[List[str]]] = {}
        for statement in self._statements(self._parse(dotted).body):
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        lists[target.id] = self._names_of(statement.value, bound, lists)
            elif isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
                name = statement.target.id
                more = self._names_of(statement.value, bound, lists)
                lists[name] = None if lists.get(name) is None or more is None else [*lists[name], *more]
            elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                func, args = statement.value.func, statement.value.args
                if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and args):
                    continue
                name = func.value.id
                if lists.get(name) is None:
                    continue
                if func.attr == "extend":
                    # An argument that is not a list of names (1.5's `__all__.extend(__version__)`, a string) adds none.
                    lists[name] = [*lists[name], *(self._names_of(args[0], bound, lists) or [])]
                elif func.attr == "append" and isinstance(args[0], ast.Constant):
                    lists[name] = [*lists[name], str(args[0].value)]
        value = lists.get("__all__")
        self._all[dotted] = value
        return value

    def _names_of(
        self, node: ast.expr, bound: Dict[str, Optional[str]], lists: Dict[str, Optional[List[str]]]
    ) -> Optional[List[str]]:
        if isinstance(node, (ast.List, ast.Tuple)):
            return [str(e.value) for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self._names_of(node.left, bound, lists), self._names_of(node.right, bound, lists)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.Name):
            return lists.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr == "__all__" and isinstance(node.value, ast.Name):
            target = bound.get(node.value.id)
            return self.all_names(target) if target else None
        return None

    def resolve(self, reference: Reference) -> Tuple[bool, str]:
        """(found, where it stopped): the module exists and each name of the chain is bound where it is looked up."""
        if not self.exists(reference.module):
            return False, f"module {reference.module} does not exist"
        current: Optional[str] = reference.module
        for name in reference.chain:
            if current is None:
                return True, "not a module: the rest is an attribute of a value"
            names = self.bound(current)
            if name not in names:
                return False, f"{current} has no {name}"
            current = names[name]
        return True, "found"


def api_record(api: Api, refs: List[Reference]) -> Dict[str, Any]:
    """For every module a reference walks through: its names (None for a module the wheel does not have)."""
    modules: Dict[str, Any] = {}
    for reference in refs:
        current: Optional[str] = reference.module
        for name in (*reference.chain, None):
            if current is None:
                break
            if current not in modules:
                if api.exists(current):
                    bound = api.bound(current)
                    modules[current] = {
                        "names": sorted(bound),
                        "modules": {k: v for k, v in sorted(bound.items()) if v is not None},
                    }
                else:
                    modules[current] = None
            if name is None or modules[current] is None:
                break
            current = (modules[current]["modules"] or {}).get(name)
    return {name: modules[name] for name in sorted(modules)}


def check_against(record: Dict[str, Any], reference: Reference) -> Tuple[bool, str]:
    """``Api.resolve`` over a recorded ``api`` table (the unit tests have no wheel)."""
    modules = record["api"]
    if reference.module not in modules:
        return False, f"{reference.module} is not recorded: run `python -m testbed.run_check_texts`"
    if modules[reference.module] is None:
        return False, f"module {reference.module} does not exist"
    current: Optional[str] = reference.module
    for name in reference.chain:
        if current is None:
            return True, "not a module: the rest is an attribute of a value"
        if current not in modules:
            return False, f"{current} is not recorded: run `python -m testbed.run_check_texts`"
        table = modules[current]
        if name not in table["names"]:
            return False, f"{current} has no {name}"
        current = table["modules"].get(name)
    return True, "found"


# --- one release --------------------------------------------------------------------------------------------


def derive(tree: Tree, refs: List[Reference]) -> Dict[str, Any]:
    """The record of one wheel (or its extract): run_check's texts and the API the references walk through."""
    return {"run_check": run_check_texts(tree), "api": api_record(Api(tree), refs)}


def _catalog() -> Dict[str, Any]:
    import yaml

    return yaml.safe_load(CATALOG.read_text())


def _pip_download(package: str, version: str, tag: str) -> Optional[Path]:
    """``pip download`` of one wheel of ``package==version`` for ``tag``; None when PyPI has none."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        f"{tag[2]}.{tag[3:]}",
        "--platform",
        "manylinux2014_x86_64",
        "--dest",
        str(WHEELS),
        f"{package}=={version}",
    ]
    log(f"pip download {package}=={version} for {tag} (hundreds of MB, once)")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    match = re.search(r"(?:Saved|File was already downloaded) (\S+\.whl)", done.stdout)
    return Path(match.group(1)) if match else _cached_wheel(package, version, tag)


def _cached_wheel(package: str, version: str, tag: Optional[str] = None) -> Optional[Path]:
    """A PyPI wheel (manylinux) of ``package==version`` in the artifact cache or the wheel cache."""
    stem = package.replace("-", "_") + "-" + version + "-"
    for folder in (ARTIFACT_CACHE, WHEELS):
        for path in sorted(folder.glob(stem + "*manylinux*.whl")) if folder.is_dir() else []:
            if tag is None or f"-{tag}-" in path.name:
                return path
    return None


def _cached_versions(package: str) -> List[str]:
    stem = package.replace("-", "_") + "-"
    names = [p.name for folder in (ARTIFACT_CACHE, WHEELS) if folder.is_dir() for p in folder.glob(stem + "*.whl")]
    return sorted({name[len(stem) :].split("-")[0] for name in names})


def find_wheel(package: str, version: str, entry: Dict[str, Any], download: bool) -> Optional[Path]:
    """A wheel of the release: the catalog's own file in the artifact cache (a vendor-only wheel too, where a
    machine that reaches the vendor's server fetched it), a PyPI wheel in a cache, else downloaded from PyPI."""
    wheels = entry.get("wheels") or {}
    for tag in PYTHON_TAGS:
        own = ARTIFACT_CACHE / wheels.get(tag, {}).get("file", "-")
        if own.is_file():
            return own
    pinned = {tag: spec for tag, spec in wheels.items() if spec.get("source") == "pypi"}
    for tag in PYTHON_TAGS:
        cached = _cached_wheel(package, version, tag)
        if cached:
            return cached
    if not download:
        return None
    for tag in sorted(PYTHON_TAGS, key=lambda t: t not in pinned):
        wheel = _pip_download(package, version, tag)
        if wheel:
            return wheel
    return None


def _pypi_versions(package: str) -> List[str]:
    command = [sys.executable, "-m", "pip", "index", "versions", package, "--python-version", "3.9"]
    command += ["--platform", "manylinux2014_x86_64", "--only-binary=:all:"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    match = re.search(r"Available versions: (.*)", done.stdout)
    return [v.strip() for v in match.group(1).split(",")] if match else []


def _version_key(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def bracket(package: str, version: str, known: List[str], online: bool) -> List[str]:
    """PyPI's nearest releases before and after ``version`` (PyPI carries no wheel of ``version`` itself)."""
    listed = _pypi_versions(package) if online else []
    available = sorted({*listed, *known, *_cached_versions(package)} - {version}, key=_version_key)
    below = [v for v in available if _version_key(v) < _version_key(version)]
    above = [v for v in available if _version_key(v) > _version_key(version) and "post" not in v]
    return [*below[-1:], *above[:1]]


def record_release(
    package: str, version: str, wheel: Path, refs: List[Reference], catalog_sha: Optional[str]
) -> Dict[str, Any]:
    digest = sha256_file(wheel)
    if catalog_sha and digest != catalog_sha:
        raise SystemExit(f"{wheel.name}: sha256 {digest} is not the catalog's {catalog_sha}")
    tree = Tree(wheel=wheel)
    record = derive(tree, refs)
    source = {
        "package": package,
        "version": version,
        "wheel": wheel.name,
        "sha256": digest,
        "bytes": wheel.stat().st_size,
    }
    folder = EXTRACTS / version
    tree.write_extract(folder, source)
    # The extract alone must say the same (the unit test derives from it, without the wheel).
    if from_extract(version, refs) != {**source, **record}:
        raise SystemExit(f"{version}: the extract in {folder} does not reproduce the wheel's record")
    return {**source, **record}


def from_extract(version: str, refs: List[Reference]) -> Optional[Dict[str, Any]]:
    """The record of ``version`` derived from its extract alone (None when there is no extract).

    Parsing the few hundred modules the API tables come from takes seconds, so the result is kept beside the extract
    (``derived.json``), keyed on the extract's source, this file and the references: any change derives again.
    """
    folder = EXTRACTS / version
    if not (folder / SOURCE).is_file():
        return None
    key = hashlib.sha256(
        Path(__file__).read_bytes()
        + (folder / SOURCE).read_bytes()
        + json.dumps([(r.module, r.chain) for r in refs], sort_keys=True).encode()
    ).hexdigest()
    kept = folder / DERIVED
    if kept.is_file():
        try:
            saved = json.loads(kept.read_text())
        except ValueError:
            saved = {}
        if saved.get("key") == key:
            return saved["record"]
    source = json.loads((folder / SOURCE).read_text())
    record = {**source, **derive(Tree(extract=folder), refs)}
    kept.write_text(json.dumps({"key": key, "record": record}, sort_keys=True) + "\n")
    return record


def build(download: bool) -> Dict[str, Any]:
    catalog = _catalog()
    refs = references()
    releases: Dict[str, Any] = {}
    missing: Dict[str, Any] = {}
    for version, entry in catalog["mindspore"].items():
        package = entry["package"]
        wheel = find_wheel(package, str(version), entry, download)
        if wheel is None:
            missing[str(version)] = package
            continue
        tag = next((t for t in PYTHON_TAGS if f"-{t}-" in wheel.name), None)
        pinned = ((entry.get("wheels") or {}).get(tag) or {}) if tag else {}
        catalog_sha = pinned.get("sha256") if pinned.get("file") == wheel.name else None
        releases[str(version)] = {"catalog": True, **record_release(package, str(version), wheel, refs, catalog_sha)}
    for version, package in missing.items():
        known = [v for v, r in releases.items() if r["package"] == package]
        neighbours = bracket(package, version, known, online=download)
        for neighbour in neighbours:
            if neighbour not in releases:
                wheel = _cached_wheel(package, neighbour) or (
                    _pip_download(package, neighbour, "cp39") if download else None
                )
                if wheel is None:
                    raise SystemExit(f"{package}=={neighbour} (around {version}) is not cached; run without --offline")
                releases[neighbour] = {"catalog": False, **record_release(package, neighbour, wheel, refs, None)}
        releases[version] = {
            "catalog": True,
            "package": package,
            "wheel": None,
            "not_on_pypi": f"PyPI has no {package}=={version} wheel (the catalog installs it from the vendor's server)",
            "bracketed_by": neighbours,
        }
    return document(releases)


def document(releases: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "format": FORMAT,
        "generated_by": "python -m testbed.run_check_texts",
        "releases": {v: releases[v] for v in sorted(releases, key=_version_key)},
    }


def rederive(committed: Dict[str, Any]) -> Dict[str, Any]:
    """The committed document with every release that has an extract derived again from it."""
    refs = references()
    releases = {}
    for version, record in committed["releases"].items():
        fresh = from_extract(version, refs) if record.get("wheel") else None
        releases[version] = {"catalog": record["catalog"], **fresh} if fresh else record
    return document(releases)


def dumps(doc: Dict[str, Any]) -> str:
    """JSON with each list of strings on one line (the API tables are long)."""
    text = json.dumps(doc, indent=1, sort_keys=True)
    one_line = re.compile(r'\[\n(?:\s*"(?:[^"\\\n]|\\.)*",?\n)+\s*\]')
    return one_line.sub(lambda m: json.dumps(json.loads(m.group(0))), text) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="re-derive from the extracts; exit 1 if the file differs")
    parser.add_argument("--offline", action="store_true", help="use cached wheels only, download nothing")
    args = parser.parse_args(argv)
    if args.check:
        committed = json.loads(DATA_FILE.read_text())
        fresh = rederive(committed)
        if fresh != committed:
            log(f"{DATA_FILE.relative_to(ROOT)} differs from what the extracts say: rerun without --check")
            return 1
        log("the data file matches the extracts")
        return 0
    doc = build(download=not args.offline)
    DATA_FILE.parent.mkdir(parents=True, exist_ok=True)
    DATA_FILE.write_text(dumps(doc))
    log(f"wrote {DATA_FILE.relative_to(ROOT)}: {', '.join(doc['releases'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
