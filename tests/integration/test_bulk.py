"""`batchfleet submit`: a JSONL file through a real fleet, bad lines reported, a rerun after
Ctrl-C resumes without running anything twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from config.keys import Keys
from workers.local.local_fleet import LocalFleet
from workers.models.synthetic import expected_output
from workers.tools.bulk import BATCH_EXPIRED, JobOptions, run_file

from .conftest import producer_for, settings_for, takes_ctrl_c, wait_ready
from .test_cli import row, run_cli


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def fleet_stats(fleet: LocalFleet) -> dict[str, int]:
    """The model's request counters in the fleet's Redis."""
    settings = settings_for(fleet.env)
    with redis.Redis.from_url(settings.redis_url.get_secret_value()) as client:
        stats = client.hgetall(Keys(settings.key_prefix).stats("synthetic"))
    return {field.decode(): int(count) for field, count in stats.items()}


def start_fleet(make_fleet: Callable[..., LocalFleet], **policy: Any) -> LocalFleet:
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps({"synthetic": policy}))
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
    return fleet


def test_a_file_of_both_formats_is_answered_line_by_line_and_bad_lines_are_reported(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    fleet = start_fleet(make_fleet, max_input_bytes=256)
    plain = [{"custom_id": f"p{n}", "input": f"text {n}"} for n in range(300)]
    openai = [
        {"custom_id": f"o{n}", "method": "POST", "url": "/v1/embeddings", "body": {"input": n}}
        for n in range(100)
    ]
    lines = [json.dumps(record) for record in plain[:150]]
    lines += ["{not json", "", json.dumps({"input": "no id"})]
    lines += [json.dumps({"custom_id": "big", "input": "x" * 1000})]
    lines += [json.dumps({"custom_id": "p3", "input": "a second p3"})]
    lines += [json.dumps(record) for record in plain[150:] + openai]
    source, output = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text("\n".join(lines) + "\n")
    done = run_cli(
        "submit",
        str(source),
        "--model",
        "synthetic",
        "-o",
        str(output),
        "--gpu-cost-per-hour",
        "2",
        env=fleet.env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "4 lines of the job ended in an error" in done.stdout

    answers = {record["custom_id"]: record["output"] for record in read_jsonl(output)}
    expected = {r["custom_id"]: expected_output(r["input"]) for r in plain}
    expected |= {r["custom_id"]: expected_output(r["body"]["input"]) for r in openai}
    assert answers == expected
    assert len(read_jsonl(output)) == 400
    errors = read_jsonl(tmp_path / "results.errors.jsonl")
    assert [(e["line"], e["custom_id"], e["error"]["code"]) for e in errors] == [
        (151, None, "invalid_line"),
        (153, None, "invalid_line"),
        (154, "big", "too_large"),
        (155, "p3", "duplicate_custom_id"),
    ]
    summary = "400 answered, 4 errors (duplicate_custom_id 1, invalid_line 2, too_large 1), 0"
    assert summary in done.stdout and "1 blank lines" in done.stdout
    report = next(line for line in done.stdout.splitlines() if line.startswith("synthetic"))
    assert row(report)["done"] == "400/400"
    assert "at 2/GPU-hour: " in done.stdout and "per 1,000 requests" in done.stdout


def test_two_jobs_may_use_the_same_custom_ids_and_a_rerun_reports_nothing_twice(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    """custom_ids belong to their job (as in OpenAI's Batch API): a second file with the same
    ids and other inputs is answered in full; rerunning a job with a bad line skips all and
    appends no error again, and still exits 1 for the job's error."""
    fleet = start_fleet(make_fleet)
    small, edited = tmp_path / "small.jsonl", tmp_path / "small_edit.jsonl"
    small.write_text(
        "".join(json.dumps({"custom_id": str(n), "input": n}) + "\n" for n in range(50))
    )
    edited.write_text(
        "".join(json.dumps({"custom_id": str(n), "input": f"edit {n}"}) + "\n" for n in range(50))
        + "{not json\n"
    )

    def submit(source: Path, output: str) -> subprocess.CompletedProcess[str]:
        command = ["submit", str(source), "--model", "synthetic", "-o", str(tmp_path / output)]
        return run_cli(*command, env=fleet.env)

    first, second = submit(small, "a.jsonl"), submit(edited, "b.jsonl")
    assert first.returncode == 0, first.stdout + first.stderr
    assert second.returncode == 1, second.stdout + second.stderr
    assert {r["custom_id"]: r["output"] for r in read_jsonl(tmp_path / "b.jsonl")} == {
        str(n): expected_output(f"edit {n}") for n in range(50)
    }
    again = submit(edited, "b.jsonl")
    assert again.returncode == 1 and "51 skipped" in again.stdout, again.stdout
    assert len(read_jsonl(tmp_path / "b.errors.jsonl")) == 1
    assert fleet_stats(fleet).get("refused:id_conflict", 0) == 0


def test_ctrl_c_stops_cleanly_and_a_rerun_resumes_without_running_anything_twice(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    """Ctrl-C while answers are coming in exits 130 with what was answered on disk; the rerun
    answers the rest and submits nothing twice. The worker is frozen once answers flow, so
    the job cannot finish before the Ctrl-C, however fast or loaded the machine."""
    fleet = start_fleet(make_fleet, max_batch_size=8, options={"base_ms": 100, "per_item_ms": 0})
    (worker,) = [process for process in fleet.processes if "worker" in process.args]
    source, output = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text(
        "".join(json.dumps({"custom_id": f"c{n}", "input": n}) + "\n" for n in range(400))
    )
    command = [sys.executable, "-m", "workers.cli", "submit", str(source)]
    command += ["--model", "synthetic", "-o", str(output), "--window", "64"]
    first = subprocess.Popen(
        command, env=fleet.env, stdout=subprocess.PIPE, text=True, preexec_fn=takes_ctrl_c
    )
    try:
        give_up = time.monotonic() + 60
        while not output.exists() or len(output.read_text().splitlines()) < 40:
            assert time.monotonic() < give_up, "no answers written"
            assert first.poll() is None, "the job ended before answers flowed"
            time.sleep(0.05)
        os.killpg(worker.pid, signal.SIGSTOP)
        first.send_signal(signal.SIGINT)
        stdout, _ = first.communicate(timeout=30)
    finally:
        os.killpg(worker.pid, signal.SIGCONT)
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 130 and "interrupted" in stdout, stdout
    answered_first = len(read_jsonl(output))
    assert 40 <= answered_first < 400

    again = run_cli("submit", *command[4:], env=fleet.env)
    assert again.returncode == 0, again.stdout + again.stderr
    custom_ids = [record["custom_id"] for record in read_jsonl(output)]
    assert sorted(custom_ids) == sorted(f"c{n}" for n in range(400))
    assert f"{answered_first} skipped" in again.stdout
    stats = fleet_stats(fleet)
    assert stats["accepted"] == 400 + 1, "a request was enqueued twice"  # + wait_ready's


def test_a_job_whose_window_ends_sends_no_more_and_ends_every_line(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    """A job whose window ends while it runs (a Batch API job's 24 h, here a second) on a
    model nobody serves, with room for one request: it sends the first line and waits for
    room for the next. Once the window has passed it sends no more: the request it sent is
    cancelled and each line never sent gets a ``batch_expired`` error line (the first too,
    on a machine too busy to send it within the second). Every line ends once, nothing
    stays queued, and the report says the job expired."""
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps({"held": {"max_queue_len": 1}}))
    source = tmp_path / "requests.jsonl"
    output, errors = tmp_path / "results.jsonl", tmp_path / "errors.jsonl"
    source.write_text(
        "".join(json.dumps({"custom_id": f"h{n}", "input": n}) + "\n" for n in range(3))
    )
    options = JobOptions(job_id="windowed", window=1, expires_at=time.time() + 1)
    with producer_for(fleet) as producer:
        report = run_file(producer, "held", source, output, errors, options, lambda _: None)
    codes = {record["custom_id"]: record["error"]["code"] for record in read_jsonl(errors)}
    assert codes.pop("h0") in ("cancelled", BATCH_EXPIRED)
    assert codes == {"h1": BATCH_EXPIRED, "h2": BATCH_EXPIRED}
    assert read_jsonl(output) == []
    assert report.expired
    settings = settings_for(fleet.env)
    with redis.Redis.from_url(settings.redis_url.get_secret_value()) as client:
        assert client.xlen(Keys(settings.key_prefix).stream("held")) == 0
