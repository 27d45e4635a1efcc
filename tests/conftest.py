"""Marks each test by its folder: ``tests/integration`` → integration, ``tests/unit`` → unit,
``tests/chaos`` → chaos and slow."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: no sockets, no subprocesses")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).relative_to(ROOT).parts[0]
        if folder in ("unit", "integration"):
            item.add_marker(folder)
        elif folder == "chaos":
            item.add_marker("chaos")
            item.add_marker("slow")
