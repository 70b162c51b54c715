"""System tests share one provisioned host: the module that uninstalls the stack runs last."""

from __future__ import annotations

import pytest

LAST = "test_uninstall.py"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name == LAST)
