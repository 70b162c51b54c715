"""`./toolkit uninstall` on a molecule scenario's converged host (MSGPU_SCENARIO_INVENTORY and MSGPU_SCENARIO,
set by ./toolkit test after the scenario's verify step, before molecule destroys the host)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="module")
def inventory() -> Path:
    value = os.environ.get("MSGPU_SCENARIO_INVENTORY", "")
    if not value or not Path(value).is_file():
        pytest.fail("MSGPU_SCENARIO_INVENTORY must name the inventory of a converged scenario host (./toolkit test)")
    return Path(value)


@pytest.fixture(scope="module")
def scenario() -> str:
    value = os.environ.get("MSGPU_SCENARIO", "")
    if not value:
        pytest.fail("MSGPU_SCENARIO must name the molecule scenario whose host this is (./toolkit test)")
    return value


@pytest.fixture(scope="module")
def host(inventory: Path) -> str:
    hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_servers"]["hosts"]
    assert len(hosts) == 1, hosts
    return next(iter(hosts))
