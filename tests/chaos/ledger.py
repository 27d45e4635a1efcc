"""The ledger of one chaos scenario: every request sent and what the producer said at submit,
and the report of how each accepted request ended."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from config.errors import BrokerUnavailable, RequestRejected
from producer.client import Producer

MODEL = "ledger"


@dataclass
class Ledger:
    """What was sent to ``model``, and what the producer answered at submit. Each input's
    ``n`` labels it (``id_prefix`` and a count: two ledgers of one scenario need two
    prefixes) and is its request id, unless ``drawn_ids``: then the producer draws the id."""

    model: str = MODEL
    id_prefix: str = "c"
    drawn_ids: bool = False
    accepted: dict[str, Any] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    refusal_s: list[float] = field(default_factory=list)
    _next: int = 0

    def new_input(self, **extra: Any) -> tuple[str, dict[str, Any]]:
        self._next += 1
        request_id = f"{self.id_prefix}{self._next}"
        return request_id, {"n": request_id, **extra}

    def send_new(self, producer: Producer, **extra: Any) -> str:
        """Submits a fresh request (``{"n": id, **extra}``); returns its id."""
        request_id, value = self.new_input(**extra)
        self.send(producer, value, request_id)
        return request_id

    def send(
        self, producer: Producer, value: dict[str, Any], request_id: str, **options: Any
    ) -> bool:
        """Submits one request; notes it accepted, or refused with its error's name (and how
        long the refusal took)."""
        started = time.monotonic()
        try:
            if self.drawn_ids:
                request_id = producer.submit(self.model, value, **options)
            else:
                producer.submit(self.model, value, request_id=request_id, **options)
        except RequestRejected as exc:
            self.refused[type(exc).__name__] += 1
            self.refusal_s.append(time.monotonic() - started)
            return False
        except BrokerUnavailable:
            self.refused["BrokerUnavailable"] += 1
            return False
        self.accepted[request_id] = value
        return True

    def open_loop(
        self,
        producer: Producer,
        rate: float,
        duration_s: float,
        make_extra: Callable[[int], dict[str, Any]] | None = None,
        **options: Any,
    ) -> None:
        """Poisson arrivals at ``rate`` per second for ``duration_s``, one submit each."""
        rng = random.Random(len(self.accepted) + sum(self.refused.values()))
        started = time.monotonic()
        next_at = started
        index = 0
        while next_at - started < duration_s:
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            request_id, value = self.new_input(**(make_extra(index) if make_extra else {}))
            self.send(producer, value, request_id, **options)
            index += 1
            next_at += rng.expovariate(rate)


@dataclass(frozen=True)
class LedgerReport:
    """One scenario's account."""

    scenario: str
    accepted: int
    ok: int
    errors: dict[str, int]
    refused: dict[str, int]
    lost: list[str]
    duplicated: list[str]
    wrong: list[str]
    reexecutions: int
    notes: str = ""

    def table(self) -> str:
        def counts(values: dict[str, int]) -> str:
            return ", ".join(f"{name} {count}" for name, count in sorted(values.items())) or "0"

        return "\n".join(
            [
                f"ledger: {self.scenario}",
                f"  accepted {self.accepted:>6}   ok {self.ok:>6}   errors {counts(self.errors)}",
                f"  refused  {counts(self.refused)}",
                f"  lost {len(self.lost)}   duplicated {len(self.duplicated)}   "
                f"wrong {len(self.wrong)}   re-executions {self.reexecutions}",
                *([f"  {self.notes}"] if self.notes else []),
            ]
        )


def assert_nothing_lost(report: LedgerReport) -> None:
    """The promise: every accepted id has exactly one final answer, and the right one."""
    assert not report.lost, f"{len(report.lost)} lost, e.g. {report.lost[:5]}\n{report.table()}"
    assert not report.duplicated, f"duplicated: {report.duplicated[:5]}\n{report.table()}"
    assert not report.wrong, f"wrong outputs: {report.wrong[:5]}\n{report.table()}"
    assert report.accepted > 0
