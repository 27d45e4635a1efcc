"""The ``batchfleet`` command refuses numbers out of range when it parses them, before it
starts anything."""

from __future__ import annotations

import pytest

from workers.cli.main import build_parser


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["bench", "saturate", "--requests", "-5"], "--requests: must be >= 1, not -5"),
        (["bench", "rate", "--rate", "0"], "--rate: must be > 0, not 0"),
        (["bench", "saturate", "--gpu-cost-per-hour", "-1"], "must be > 0, not -1"),
        (["bench", "sweep", "--rates", "50,-2"], "--rates: must be > 0, not -2"),
        (["submit", "f.jsonl", "--model", "m", "-o", "o", "--deadline", "0"], "must be > 0"),
        (["submit", "f.jsonl", "--model", "m", "-o", "o", "--window", "0"], "must be >= 1"),
        (["top", "--refresh", "0"], "--refresh: must be >= 0.1, not 0"),
        (["top", "--refresh", "-1"], "--refresh: must be >= 0.1, not -1"),
        (["top", "--gpu-cost-per-hour", "nan"], "must be > 0, not nan"),
        (["batcher", "--metrics-port", "70000"], "must be >= 1 and <= 65535, not 70000"),
        (["demo", "--requests", "ten"], "--requests: not a number: 'ten'"),
    ],
)
def test_out_of_range_arguments_are_refused_at_parse_time(
    argv: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A negative request count, a zero deadline or refresh, a negative price: argparse's
    usage error (exit 2) naming the option and the range."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert refusal in capsys.readouterr().err


def test_in_range_arguments_parse_to_numbers() -> None:
    """Numbers in range parse as before: a rate list to floats, zero where zero is allowed."""
    args = build_parser().parse_args(["bench", "sweep", "--rates", "50,200", "--inflight", "0"])
    assert args.rates == (50.0, 200.0) and args.inflight == 0
