"""Chaos fixtures: a fresh fleet per scenario, and every scenario's ledger table printed at the
end of the run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import ChaosFleet
from tests.chaos.ledger import LedgerReport

REPORTS: list[LedgerReport] = []


@pytest.fixture
def chaos_fleet(tmp_path: Path) -> Iterator[Callable[..., ChaosFleet]]:
    """Builds and starts a ChaosFleet (Redis arguments, policy, model options, environment);
    everything it started is stopped after the test."""
    fleets: list[ChaosFleet] = []

    def make(*redis_args: str, **kwargs: Any) -> ChaosFleet:
        fleet = ChaosFleet(tmp_path, *redis_args, **kwargs)
        fleets.append(fleet)
        return fleet.start()

    yield make
    for fleet in fleets:
        fleet.close()


@pytest.fixture
def record() -> Callable[[LedgerReport], LedgerReport]:
    """Keeps a scenario's report for the end-of-run summary."""

    def keep(report: LedgerReport) -> LedgerReport:
        REPORTS.append(report)
        return report

    return keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORTS:
        terminalreporter.section("chaos ledgers")
        for report in REPORTS:
            terminalreporter.write_line(report.table())
