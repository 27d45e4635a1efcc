"""Argument types for the ``batchfleet`` command: numbers out of range are refused when the
command line is parsed, with the range in the message, before anything starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MIN_REFRESH_S = 0.1


def number_in(
    kind: type[int] | type[float], low: float, high: float = math.inf, above_low: bool = False
) -> Callable[[str], float]:
    """An argparse type: a ``kind`` number from ``low`` (excluded when ``above_low``) up to
    ``high``."""
    wanted = f"{'>' if above_low else '>='} {low:g}" + (
        f" and <= {high:g}" if high < math.inf else ""
    )

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < low or value > high or (above_low and value == low):
            raise argparse.ArgumentTypeError(f"must be {wanted}, not {text}")
        return value

    return parse


positive_int = number_in(int, 1)
non_negative_int = number_in(int, 0)
positive_float = number_in(float, 0, above_low=True)
non_negative_float = number_in(float, 0)
refresh_seconds = number_in(float, MIN_REFRESH_S)
port_number = number_in(int, 1, 65535)


def rate_list(text: str) -> tuple[float, ...]:
    """``"50,200,800"`` → rates, each above 0."""
    return tuple(positive_float(part) for part in text.split(","))
