"""One batch as a worker runs it: which of its requests run, and the answers it gathers.

A batch's requests are sorted before the device takes them: malformed entries, requests
already answered by an earlier delivery, past their deadline, or out of attempts are answered
at once (their ``answers``); the rest run. Late joiners taken from the stream when the device
frees are sorted the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from config.schema import STREAM_FIELD, Request, Result
from workers.protocol.capacity import FleetState
from workers.protocol.entries import DecodedEntry, StreamEntry, read_entries
from workers.protocol.results import Answer, ResultWriter, error_answer, poison_answer
from workers.runtime.device import Device, Runnable, nothing_to_read


@dataclass
class BatchRun:
    """What one delivery of a batch carries from its start to its last written answer."""

    model: str
    batch_id: str
    flush_reason: str | None
    writer: ResultWriter
    state: FleetState
    ttl_s: float
    lease_s: float
    answers: list[Answer] = field(default_factory=list)
    late: set[str] = field(default_factory=set)
    dropped: list[str] = field(default_factory=list)
    slot_reply: Callable[[], None] | None = None

    def read(self, entries: Sequence[Sequence[str]]) -> tuple[list[DecodedEntry], list[str]]:
        """Decodes the task's ``(entry id, raw)`` pairs: the requests, and every entry id;
        malformed entries are answered ``invalid_input``."""
        read = read_entries(
            [(entry_id, {STREAM_FIELD: raw}) for entry_id, raw in entries], self.model, self.ttl_s
        )
        self.answers.extend(read.invalid)
        self.dropped.extend(read.dropped)
        return read.decoded, [entry_id for entry_id, _ in entries]

    def count_attempts(
        self, consumer: str, decoded: Sequence[DecodedEntry], max_attempts: int
    ) -> tuple[list[DecodedEntry], set[str]]:
        """The requests still to try, and the entries a live device is running now; those out
        of attempts are answered ``poison`` and go to the dead-letter stream."""
        attempts = self.writer.count_device_deaths(
            consumer, [entry_id for entry_id, _, _ in decoded]
        )
        to_try, poison, running = [], [], set()
        for (entry_id, raw, request), tries in zip(decoded, attempts, strict=True):
            if tries is None:
                running.add(entry_id)
            elif tries >= max_attempts:
                self.answers.append(poison_answer(request, entry_id, tries, self.ttl_s))
                poison.append((entry_id, raw, tries))
            else:
                to_try.append((entry_id, raw, request))
        self.writer.bury(poison)
        return to_try, running

    def sort_out(self, decoded: Sequence[DecodedEntry], done: Sequence[bool]) -> list[Runnable]:
        """The requests to run; those already answered or past their deadline are answered."""
        runnable = []
        now = time.time()
        for (entry_id, _, request), answered in zip(decoded, done, strict=True):
            if answered:
                self.answers.append(
                    Answer.of(entry_id, _placeholder(request), request.digest, self.ttl_s)
                )
            elif request.deadline_at <= now:
                self.answers.append(
                    error_answer(
                        request,
                        entry_id,
                        "expired",
                        "deadline passed before the request ran",
                        self.ttl_s,
                    )
                )
            else:
                runnable.append((entry_id, request))
        return runnable

    def sort_late(self, entries: Sequence[StreamEntry]) -> list[Runnable]:
        """The late joiners to run; malformed or expired ones are answered, unreadable
        entries dropped."""
        if not entries:
            return []
        read = read_entries(entries, self.model, self.ttl_s)
        self.answers.extend(read.invalid)
        self.writer.drop(read.dropped)
        late = self.sort_out(read.decoded, [False] * len(read.decoded))
        self.late.update(entry_id for entry_id, _ in late)
        return late

    def flush_reason_of(self, entry_id: str) -> str | None:
        """Why the request ran in this batch: the batch's flush reason, or ``late``."""
        return "late" if entry_id in self.late else self.flush_reason

    def start(
        self,
        consumer: str,
        member: str,
        entry_ids: Sequence[str],
        decoded: Sequence[DecodedEntry],
    ) -> list[bool]:
        """Records the batch as run by ``member``, moves ``entry_ids`` to ``consumer``
        (restarting their lease: a running batch is never reclaimed while it can still
        finish) and says which ``decoded`` requests a previous delivery already answered, in
        one round trip."""
        request_ids = [request.request_id for _, _, request in decoded]
        return self.writer.start_batch(self.batch_id, member, consumer, entry_ids, request_ids)

    def finish(self, computed: Sequence[Answer]) -> None:
        """Writes the answers ``computed`` by the model with every answer gathered so far
        (first answer wins), then takes the unreadable entries out of the stream."""
        self.writer.finalize([*self.answers, *computed])
        self.writer.drop(self.dropped)

    def free_slot(self, device: Device | None = None) -> None:
        """Gives the batch's worker slot back, once: when the device is done with the batch,
        so that the next batch travels to the worker while this one's answers are written,
        and whatever happened (requests a failure left unanswered stay pending in the
        stream and are reclaimed after the lease). It is sent, not waited for:
        ``slot_freed`` reads Redis's reply. Given the ``device`` this batch still holds, the
        release rides in the claim of a batch waiting for it (``Device.hand_over``)."""
        if self.slot_reply is not None:
            return
        if device is not None and device.hand_over(
            self.state.slot_release(self.batch_id, self.lease_s)
        ):
            self.slot_reply = nothing_to_read
        else:
            self.slot_reply = self.state.batch_done(self.batch_id, self.lease_s)

    def slot_freed(self) -> None:
        """Reads Redis's reply to ``free_slot`` (once it was sent; once)."""
        reply, self.slot_reply = self.slot_reply, nothing_to_read
        if reply is not None:
            reply()


def _placeholder(request: Request) -> Result:
    """Stands in for an answer already written; the finalize script keeps the first one."""
    return Result(request_id=request.request_id, model=request.model, finished_at=time.time())
