"""The molecule scenarios share one base config, .config/molecule/config.yml: molecule finds it at the root of the
repository it runs in and merges each molecule/<scenario>/molecule.yml over it (molecule's own merge_dicts:
mappings key by key, lists whole). Each scenario file keeps only what it does differently, and the merged
config names files that exist and the settings testbed/scenarios.py writes for the scenario."""

from __future__ import annotations

import os
import re

import pytest
import yaml
from molecule.util import merge_dicts

from testbed import scenarios
from tests.conftest import ROOT

BASE = ROOT / ".config" / "molecule" / "config.yml"


def scenario_file(name: str) -> dict:
    return yaml.safe_load((ROOT / "molecule" / name / "molecule.yml").read_text())


def merged(name: str) -> dict:
    """The scenario's config as molecule merges it, with its ${MOLECULE_SCENARIO_NAME} filled in."""
    text = yaml.safe_dump(merge_dicts(yaml.safe_load(BASE.read_text()), scenario_file(name)))
    return yaml.safe_load(text.replace("${MOLECULE_SCENARIO_NAME}", name))


def repeated(base: object, own: object, where: str = "") -> list[str]:
    """The settings of a scenario file that only repeat the base config's."""
    if isinstance(base, dict) and isinstance(own, dict):
        return [line for key in own if key in base for line in repeated(base[key], own[key], f"{where}/{key}")]
    return [where] if base == own else []


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_the_scenario_holds_only_what_differs(name):
    assert repeated(yaml.safe_load(BASE.read_text()), scenario_file(name)) == []


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_the_merged_scenario_is_complete(name):
    config = merged(name)
    folder = ROOT / "molecule" / name
    assert config["driver"]["name"] == "docker"
    assert [p["groups"] for p in config["platforms"]] == [["gpu_servers"]]
    for playbook in ("prepare", "converge", "side_effect"):
        if playbook in config["provisioner"]["playbooks"]:
            assert (folder / config["provisioner"]["playbooks"][playbook]).is_file(), playbook
    assert (folder / config["verifier"]["directory"]).is_dir()
    # Where testbed/scenarios.py (write_group_vars: MOLECULE_VARS) writes the scenario's settings in the checkout.
    link = os.path.normpath(folder / config["provisioner"]["inventory"]["links"]["group_vars"])
    assert link == str(ROOT / ".cache" / scenarios.MOLECULE_VARS.name / name / "group_vars")
    assert config["scenario"]["test_sequence"][0] == config["scenario"]["test_sequence"][-1] == "destroy"
    # Molecule fills in no variable but its own (MOLECULE_*) and the test bed's image (MSGPU_SANDBOX_IMAGE).
    text = BASE.read_text() + (folder / "molecule.yml").read_text()
    assert set(re.findall(r"\$\{(\w+)", text)) <= {
        "MOLECULE_PROJECT_DIRECTORY",
        "MOLECULE_SCENARIO_NAME",
        "MSGPU_SANDBOX_IMAGE",
    }
