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


def test_mnist_checksums_match_the_shared_data(catalog):
    sums = ROOT.parent / "shared" / "data" / "mnist" / "SHA256SUMS"
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
    for path in [*ROOT.glob("roles/*/defaults/*.yml"), *ROOT.glob("roles/*/tasks/*.yml"),
                 *ROOT.glob("roles/*/templates/*"), *ROOT.glob("playbooks/*.yml")]:
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
