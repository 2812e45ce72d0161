"""The unit layer: pure decisions, no services, no clock, no network. Every test here is marked
``unit`` (``make test-fast`` runs this folder); a fixture that starts a service does not belong here."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.unit)
