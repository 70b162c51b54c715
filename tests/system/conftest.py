"""System tests share one provisioned host (MSGPU_VERIFY_INVENTORY, set by ./toolkit test): the module
that uninstalls the stack runs last."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LAST = "test_uninstall.py"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name == LAST)


@pytest.fixture(scope="module")
def inventory() -> Path:
    """The inventory of the provisioned sandbox host (molecule default's, kept for these tests)."""
    value = os.environ.get("MSGPU_VERIFY_INVENTORY", "")
    if not value or not Path(value).is_file():
        pytest.fail(
            "MSGPU_VERIFY_INVENTORY must name the inventory of a provisioned sandbox host (set by ./toolkit test)"
        )
    return Path(value)
