"""Where a worker's timer slack cannot be tightened it is left as it is, and the worker goes
on, its timed waits as late as the system lets them."""

from __future__ import annotations

import ctypes
import logging
import sys

import pytest

from workers.runtime import timer_slack


class RefusingLibc:
    def prctl(self, *args: object) -> int:
        return -1


def test_a_refused_prctl_is_logged_and_left(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: RefusingLibc())
    with caplog.at_level(logging.WARNING, logger=timer_slack.__name__):
        assert timer_slack.tighten_timer_slack() is False
    assert "timer slack left as it was" in caplog.text


def test_other_systems_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: pytest.fail("prctl called"))
    assert timer_slack.tighten_timer_slack() is False
