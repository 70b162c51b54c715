"""The catalog is the one source of versions: every reference inside it must resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import catalog_artifacts

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("mindspore", "cuda", "cudnn", "nccl", "tensorrt", "openmpi")


def test_default_stack_exists(catalog):
    assert catalog["default_stack"] in catalog["stacks"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_stacks_reference_catalog_entries(catalog, component):
    for name, stack in catalog["stacks"].items():
        versions = [stack[component], *stack.get("also_accepts", {}).get(component, [])]
        missing = [v for v in versions if str(v) not in catalog[component]]
        assert not missing, f"stack {name}: {component} {missing} not in the catalog"


def test_stack_default_methods_are_known(catalog):
    for name, stack in catalog["stacks"].items():
        for component, method in stack["default_methods"].items():
            assert method in catalog["install_methods"][component], f"stack {name}: {component} {method}"


def test_sources_of_artifacts_exist(catalog):
    # Per-tag wheel files (TensorRT's) inherit their parent's source and carry no own one.
    found = [artifact for artifact in catalog_artifacts(catalog) if "source" in artifact]
    assert len(found) > 20
    for artifact in found:
        assert artifact["source"] in catalog["sources"] or artifact["source"] == "pypi", artifact
        if artifact["source"] != "pypi":
            assert artifact["path"].endswith(artifact["file"]), artifact
        sha = artifact.get("sha256")
        assert sha is None or re.fullmatch(r"[0-9a-f]{64}", sha), artifact


def test_mnist_checksums_match_the_repository_copy(catalog):
    sums = ROOT / "data" / "mnist" / "SHA256SUMS"
    if not sums.is_file():
        pytest.fail(f"{sums} is missing: the test data set this project is built against")
    published = dict(reversed(line.split()) for line in sums.read_text().splitlines() if line.strip())
    assert catalog["mnist"]["files"] == published


def test_argument_specs_match_role_defaults():
    """Every role input is declared with a type, and every declared input has a default."""
    for role in sorted((ROOT / "roles").iterdir()):
        defaults_file = role / "defaults" / "main.yml"
        specs_file = role / "meta" / "argument_specs.yml"
        assert specs_file.is_file(), f"{role.name}: meta/argument_specs.yml missing"
        defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.is_file() else {}
        spec = yaml.safe_load(specs_file.read_text())["argument_specs"]["main"]["options"]
        assert set(spec) == set(defaults), f"{role.name}: argument_specs and defaults differ"
        for name, option in spec.items():
            assert "type" in option and "description" in option, f"{role.name}: {name}"


def test_no_version_numbers_outside_the_catalog():
    """Role defaults and tasks must take versions from the catalog, not hard-code them."""
    pattern = re.compile(r"\b(11\.[0-9]\b|8\.0\.5|2\.8\.4|7\.2\.2|470\.\d+|1\.5\.[01]\b|2\.2\.14)")
    offenders = []
    for path in [
        *ROOT.glob("roles/*/defaults/*.yml"),
        *ROOT.glob("roles/*/tasks/*.yml"),
        *ROOT.glob("roles/*/templates/*"),
        *ROOT.glob("playbooks/*.yml"),
    ]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_stacks_serving_entries_serve_their_mindspore(catalog):
    """A stack's `serving` names a catalog release that lists the stack's MindSpore."""
    named = 0
    for name, stack in catalog["stacks"].items():
        if not stack.get("serving"):
            continue
        named += 1
        entry = catalog["serving"][str(stack["serving"])]
        assert str(stack["mindspore"]) in entry["mindspore"], f"stack {name}"
        assert set(entry["wheels"]) <= set(catalog["mindspore"][str(stack["mindspore"])]["wheels"]), f"stack {name}"
    assert named >= 2


# --- every artifact pinned, with provenance (issue 14) ------------------------------------------
def _artifact_entries(node, where="catalog"):
    """(place, entry) for every mapping in the catalog that names a downloadable `file` (a signing
    key, trusted by its `fingerprint` instead of a checksum, is not one)."""
    if isinstance(node, dict):
        if "file" in node and "fingerprint" not in node:
            yield where, node
        for key, value in node.items():
            yield from _artifact_entries(value, f"{where}.{key}")
    elif isinstance(node, list):
        for number, value in enumerate(node):
            yield from _artifact_entries(value, f"{where}[{number}]")


def test_every_artifact_is_pinned_with_provenance_or_says_why_not(catalog):
    """Each file of each stack has a 64-hex sha256 and where it was read (`sha256_from`), or
    `sha256: null` and a non-empty `no_public_checksum` reason: never a bare null."""
    entries = list(_artifact_entries(catalog))
    assert len(entries) > 40
    problems = []
    for where, entry in entries:
        sha, origin, why = entry.get("sha256", "missing"), entry.get("sha256_from"), entry.get("no_public_checksum")
        if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha):
            if not (isinstance(origin, str) and origin.strip()):
                problems.append(f"{where} ({entry['file']}): sha256 without sha256_from")
            if why is not None:
                problems.append(f"{where} ({entry['file']}): pinned, yet says no_public_checksum")
        elif sha is None:
            if not (isinstance(why, str) and why.strip()):
                problems.append(f"{where} ({entry['file']}): sha256 null without a no_public_checksum reason")
            if origin is not None:
                problems.append(f"{where} ({entry['file']}): sha256_from for a null sha256")
        else:
            problems.append(f"{where} ({entry['file']}): sha256 {sha!r} is neither 64 hex characters nor null")
    assert not problems, "\n".join(problems)


def test_nvidia_files_come_from_public_no_login_paths_where_nvidia_has_them(catalog):
    """cuDNN 8.0.5 and NCCL are on NVIDIA's public redist server; only TensorRT 7 is login-walled."""
    secure = [
        entry["file"]
        for _, entry in _artifact_entries(catalog)
        if entry.get("source") == "nvidia_developer" and "/secure/" in entry.get("path", "")
    ]
    assert secure == ["TensorRT-7.2.2.3.Ubuntu-18.04.x86_64-gnu.cuda-11.1.cudnn8.0.tar.gz"]


def _default_stack_refusals(stack_catalog, catalog):
    result = stack_catalog.resolve_stack(catalog, {"artifact_checksums": {}})
    return [e for e in result["errors"] if e.startswith("stack_artifact_checksums.")], result["errors"]


def test_default_stack_resolves_with_no_checksums_from_the_user(stack_catalog, catalog):
    """The default stack with its default methods needs no stack_artifact_checksums at all."""
    _, errors = _default_stack_refusals(stack_catalog, catalog)
    assert errors == []


def test_default_stack_refuses_only_files_without_a_public_checksum(stack_catalog, catalog):
    """Whatever the default stack still refuses is a file the catalog says no public sha256 exists
    for, and the refusal gives the reason, the URL and the exact steps to pin the user's copy."""
    refusals, errors = _default_stack_refusals(stack_catalog, catalog)
    assert refusals == errors
    reasons = {entry["file"]: entry for _, entry in _artifact_entries(catalog) if entry.get("no_public_checksum")}
    for error in refusals:
        name = error.split(":", 1)[0].removeprefix("stack_artifact_checksums.")
        assert name in reasons, error
        assert " ".join(reasons[name]["no_public_checksum"].split()) in error
        assert f"`sha256sum {name}`" in error
        assert f'`stack_artifact_checksums: {{"{name}": <sum>}}`' in error
        assert "group_vars" in error and "stack_local_artifacts" in error
        assert f"/{reasons[name]['path']}" in error  # the URL to download it from


def test_default_stack_downloads_are_checked_against_the_catalogs_sums(stack_catalog, catalog):
    """With only the unpinnable files given, every file the default stack downloads carries the
    catalog's own sha256 (the artifact cache fetches nothing unchecked)."""
    unpinnable = {e["file"]: "ab" * 32 for _, e in _artifact_entries(catalog) if e.get("no_public_checksum")}
    result = stack_catalog.resolve_stack(catalog, {"artifact_checksums": unpinnable, "artifact_cache_dir": "/srv/c"})
    assert result["errors"] == []
    pinned = {e["file"]: e["sha256"] for _, e in _artifact_entries(catalog) if e.get("sha256")}
    downloads = [d for d in result["stack"]["artifact_cache"]["downloads"] if d["component"] != "mnist"]
    assert {"cuda", "cudnn", "nccl", "mindspore"} <= {d["component"] for d in downloads}
    for entry in downloads:
        assert entry["sha256"] == pinned.get(entry["file"], unpinnable.get(entry["file"])), entry
