"""System tests share one provisioned host (MSGPU_VERIFY_INVENTORY, set by ./toolkit test): the module
that changes the driver branch runs second to last, the one that uninstalls the stack last."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Last, in this order: the driver branch change (the host then has another branch than the stack's),
# then the uninstall (it removes what every other module uses).
LAST = ("test_driver_upgrade.py", "test_uninstall.py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: LAST.index(item.path.name) + 1 if item.path.name in LAST else 0)


@pytest.fixture(scope="module")
def inventory() -> Path:
    """The inventory of the provisioned sandbox host (molecule default's, kept for these tests)."""
    value = os.environ.get("MSGPU_VERIFY_INVENTORY", "")
    if not value or not Path(value).is_file():
        pytest.fail(
            "MSGPU_VERIFY_INVENTORY must name the inventory of a provisioned sandbox host (set by ./toolkit test)"
        )
    return Path(value)
