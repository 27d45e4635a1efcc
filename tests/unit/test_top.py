"""`batchfleet top`'s model view: each model's own batch size, and every column on a narrow
terminal."""

from __future__ import annotations

import pytest
from rich.console import Console

from workers.tools.top import Snapshot, model_tables


def snapshot(now: float, busy_batches: int, busy_requests: int, completed: int) -> Snapshot:
    """A fleet serving ``busy`` (one worker, its calls so far) and ``idle`` (nothing)."""
    node = {
        "models": "busy,idle",
        "batches": str(busy_batches),
        "requests": str(busy_requests),
        "batches:busy": str(busy_batches),
        "requests:busy": str(busy_requests),
    }
    return Snapshot(
        now=now,
        depths={"busy": 12, "idle": 0},
        stats={
            "busy": {"accepted": completed + 12, "completed": completed},
            "idle": {},
        },
        latencies={"busy": [(now - 1, 0.0408), (now - 0.5, 0.0438)], "idle": []},
        nodes={"w1@h": node},
    )


def screen(width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    before, now = snapshot(100.0, 10, 200, 180), snapshot(101.0, 30, 600, 580)
    for table in model_tables(before, now, width):
        console.print(table)
    return console.export_text()


def rows_of(text: str, model: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.split()[:1] == [model]]


def test_an_idle_model_shows_no_batch_size_of_its_own() -> None:
    """The busy model's batch is its requests per call (400 / 20 = 20.0); the idle model,
    served by the same worker, shows '-', not the worker's overall mean."""
    (busy,), (idle,) = rows_of(screen(80), "busy"), rows_of(screen(80), "idle")
    assert busy[4] == "20.0"
    assert idle[4] == "-"


@pytest.mark.parametrize("width", [45, 56, 80])
def test_every_model_column_shows_whole_on_a_narrow_terminal(width: int) -> None:
    """At 45 columns the view splits in two tables, and p99 and err still show, uncut."""
    text = screen(width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    for header in ("queue", "in/s", "out/s", "batch", "p50", "p99", "err"):
        assert header in text, f"{header} missing at {width} columns:\n{text}"
    busy_cells = [cell for row in rows_of(text, "busy") for cell in row]
    assert "43.8" in busy_cells and "0%" in busy_cells, text
