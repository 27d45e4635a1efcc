"""A bulk job's files: reading requests from its JSONL input, naming the job and its requests,
and what earlier runs of the job already wrote, so that a rerun resumes.

One request per line, in the OpenAI Batch input format (``{"custom_id", "body": {...}}``: the
body's ``input``, else the body without its ``model``, is the request's input) or plain
(``{"custom_id", "input"}``). A ``custom_id`` belongs to its job, as in OpenAI's Batch API: a
line's request id is derived from the model, the job id and the custom_id, so two jobs may
use the same custom_ids for other inputs, while a rerun of the same job finds its requests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.errors import ConfigError

# The codes of error lines that end their custom_id: a rerun does not ask it again. A
# ``duplicate_custom_id`` error belongs to its line, not to the custom_id's first line.
LINE_ONLY_ERRORS = ("invalid_line", "duplicate_custom_id")
TAIL_CHUNK_BYTES = 1 << 16


@dataclass(frozen=True)
class Line:
    """One request read from the file."""

    number: int
    custom_id: str
    input: Any


@dataclass(frozen=True)
class BadLine:
    """A line that is no request, with why."""

    number: int
    custom_id: str | None
    code: str
    message: str


def parse_line(number: int, text: str) -> Line | BadLine | None:
    """The request on one line; None for a blank line."""
    if not text.strip():
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return BadLine(number, None, "invalid_line", f"line {number}: not JSON: {exc.msg}")
    if not isinstance(record, dict):
        return BadLine(number, None, "invalid_line", f"line {number}: not a JSON object")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BadLine(number, None, "invalid_line", f"line {number}: no string custom_id")
    if "input" in record:
        return Line(number, custom_id, record["input"])
    body = record.get("body")
    if isinstance(body, dict) and body:
        if "input" in body:
            return Line(number, custom_id, body["input"])
        fields = {key: value for key, value in body.items() if key != "model"}
        if fields:
            return Line(number, custom_id, fields)
    return BadLine(
        number, custom_id, "invalid_line", f"line {number}: neither an input nor a request body"
    )


def default_job_id(source: Path, output: Path) -> str:
    """The job of running ``source`` into ``output``: the same for the same two files in
    every run (a rerun resumes), another for any other file."""
    where = f"{source.resolve()}\0{output.resolve()}"
    return "file-" + hashlib.blake2b(where.encode(), digest_size=8).hexdigest()


def request_id_for(model: str, job_id: str, custom_id: str) -> str:
    """The request id of a line: the same for the same model, job and custom_id."""
    name = f"{model}\0{job_id}\0{custom_id}"
    return "bulk-" + hashlib.blake2b(name.encode(), digest_size=20).hexdigest()


def custom_id_key(custom_id: str) -> int:
    """A 64-bit hash standing for a custom_id in memory (a million take ~70 MB)."""
    return int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "big")


@dataclass
class EarlierRuns:
    """What earlier runs of a job wrote: the custom_ids answered, those that ended in an
    error, and the bad lines already reported (by number and message: a line fixed since is
    read again)."""

    answered: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    reported: set[tuple[int, str]] = field(default_factory=set)

    def outcome(self, line: Line | BadLine) -> str | None:
        """``"answered"`` or ``"error"`` when an earlier run ended this line; None if not."""
        if isinstance(line, BadLine):
            return "error" if (line.number, line.message) in self.reported else None
        key = custom_id_key(line.custom_id)
        if key in self.answered:
            return "answered"
        return "error" if key in self.failed else None


def read_earlier_runs(output: Path, errors: Path) -> EarlierRuns:
    """Reads what earlier runs appended to ``output`` and ``errors``; a line cut short by a
    crash is skipped (its request is asked again)."""
    earlier = EarlierRuns()
    for path in (output, errors):
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as lines:
            for text in lines:
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    note_record(earlier, record)
    return earlier


def note_record(earlier: EarlierRuns, record: dict[str, Any]) -> None:
    """Adds one answer or error line to what earlier runs ended."""
    error = record.get("error")
    custom_id = record.get("custom_id")
    if not isinstance(error, dict):
        if isinstance(custom_id, str):
            earlier.answered.add(custom_id_key(custom_id))
    elif error.get("code") in LINE_ONLY_ERRORS:
        earlier.reported.add((record.get("line", 0), str(error.get("message"))))
    elif isinstance(custom_id, str):
        earlier.failed.add(custom_id_key(custom_id))


def claim_output(output: Path, job_id: str) -> None:
    """Marks ``output`` as the answers of job ``job_id`` (in ``OUTPUT.job``), so that a rerun
    resumes it and no other job mixes its lines in.

    Raises:
        ConfigError: ``output`` holds another job's answers.
    """
    marker = output.with_suffix(".job")
    if marker.exists():
        holder = marker.read_text(encoding="utf-8").strip()
        if holder != job_id:
            raise ConfigError(
                f"{output} holds the answers of job {holder}, not {job_id}: write this job to "
                f"another output, or resume that one with --job-id {holder}"
            )
        return
    marker.write_text(job_id + "\n", encoding="utf-8")


def drop_partial_line(path: Path) -> None:
    """Cuts ``path`` back to its last complete line: a process killed mid-write leaves a piece
    of a line, which the next line appended would otherwise join (the request of a dropped
    piece is asked again)."""
    if not path.exists():
        return
    with path.open("r+b") as file:
        end = file.seek(0, 2)
        keep = end
        while keep > 0:
            start = max(0, keep - TAIL_CHUNK_BYTES)
            file.seek(start)
            chunk = file.read(keep - start)
            if keep == end and chunk.endswith(b"\n"):
                return
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        file.truncate(keep)


def count_lines(path: Path) -> int:
    """The lines of ``path``, the last one counted with or without its newline."""
    lines, last = 0, b"\n"
    with path.open("rb") as source:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")
