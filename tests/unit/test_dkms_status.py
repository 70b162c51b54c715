"""The `dkms status` parsing of the nvidia_driver role's DKMS repair (roles/nvidia_driver/tasks/dkms_repair.yml):
the regex its Jinja applies with regex_findall(multiline=True), against the formats of focal's dkms 2.8 and of
dkms 3, the states an interrupted build leaves, and the noise dkms prints around them."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.conftest import ROOT

TASKS = ROOT / "roles" / "nvidia_driver" / "tasks" / "dkms_repair.yml"


def _find(node, key: str):
    if isinstance(node, dict):
        if key in node:
            return node[key]
        node = list(node.values())
    if isinstance(node, list):
        for item in node:
            found = _find(item, key)
            if found is not None:
                return found
    return None


@pytest.fixture(scope="module")
def entries():
    """What the role's regex_findall makes of a `dkms status` output: (module, release, kernel, state)."""
    pattern = _find(yaml.safe_load(TASKS.read_text()), "__nvidia_driver_dkms_status_regex")
    assert pattern, f"no __nvidia_driver_dkms_status_regex in {TASKS}"
    return lambda status: re.findall(pattern, status, re.MULTILINE)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # dkms 2.8 (Ubuntu 20.04)
        ("nvidia, 470.256.02, 5.4.0-216-generic, x86_64: installed", ("nvidia", "470.256.02", "5.4.0-216-generic")),
        # dkms 3.x
        ("nvidia/470.256.02, 5.4.0-216-generic, x86_64: installed", ("nvidia", "470.256.02", "5.4.0-216-generic")),
    ],
)
def test_installed_in_either_format(entries, line, expected):
    assert entries(line) == [(*expected, "installed")]


@pytest.mark.parametrize("line", ["nvidia, 470.256.02: added", "nvidia/470.256.02: added"])
def test_added_has_no_kernel(entries, line):
    assert entries(line) == [("nvidia", "470.256.02", "", "added")]


def test_built_and_installed_per_kernel_with_dkms_remarks(entries):
    status = (
        "nvidia, 470.256.02, 5.4.0-216-generic, x86_64: installed (WARNING! Diff between built and installed module!)\n"
        "nvidia, 470.256.02, 5.4.0-26-generic, x86_64: built\n"
        "nvidia/470.86, 5.15.0-91-generic, x86_64: installed (original_module exists)\n"
    )
    assert entries(status) == [
        ("nvidia", "470.256.02", "5.4.0-216-generic", "installed"),
        ("nvidia", "470.256.02", "5.4.0-26-generic", "built"),
        ("nvidia", "470.86", "5.15.0-91-generic", "installed"),
    ]


def test_dkms_warnings_and_errors_are_not_entries(entries):
    noise = (
        "Deprecated feature: REMAKE_INITRD (/var/lib/dkms/nvidia/470.256.02/source/dkms.conf)\n"
        "Error! Could not locate dkms.conf file.\n"
        "File: /var/lib/dkms/nvidia/470.256.02/source/dkms.conf does not exist.\n"
        "Warning: dkms status output may change\n"
        "\n"
    )
    assert entries(noise) == []


def test_other_modules_are_entries_the_role_then_filters_out(entries):
    status = "virtualbox, 6.1.16, 5.4.0-216-generic, x86_64: installed\nnvidia, 460.91.03: added\n"
    assert [e[0] for e in entries(status)] == ["virtualbox", "nvidia"]
