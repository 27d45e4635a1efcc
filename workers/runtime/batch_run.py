"""One batch as a worker runs it: which of its requests run, and the answers it gathers.

A batch's requests are sorted before the device takes them: malformed entries, requests past
their deadline or out of attempts are answered at once (their ``answers``); the rest run (a
request with its answer already is no longer in the stream, so its batch never claims it).
Late joiners taken from the stream when the device frees are sorted the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

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
    slot_reply: Callable[[], object] | None = None

    def count_attempts(self, consumer: str, entry_ids: Sequence[str]) -> dict[str, int | None]:
        """For a batch delivered again: each entry's attempts, counting a death for those on
        the device of a process that is gone, and None for those a live device is running
        now (``ResultWriter.count_device_deaths``)."""
        return dict(
            zip(entry_ids, self.writer.count_device_deaths(consumer, entry_ids), strict=True)
        )

    def give_up_poison(
        self, decoded: Sequence[DecodedEntry], attempts: Mapping[str, int | None], max_attempts: int
    ) -> list[DecodedEntry]:
        """The requests still to try; those out of ``attempts`` are answered ``poison`` and
        go to the dead-letter stream."""
        to_try, poison = [], []
        for entry_id, raw, request in decoded:
            tries = attempts.get(entry_id) or 0
            if tries >= max_attempts:
                self.answers.append(poison_answer(request, entry_id, tries, self.ttl_s))
                poison.append((entry_id, raw, tries))
            else:
                to_try.append((entry_id, raw, request))
        self.writer.bury(poison)
        return to_try

    def sort_out(self, decoded: Sequence[DecodedEntry]) -> list[Runnable]:
        """The requests to run; those past their deadline are answered."""
        runnable = []
        now = time.time()
        for entry_id, _, request in decoded:
            if request.deadline_at <= now:
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
        late = self.sort_out(read.decoded)
        self.late.update(entry_id for entry_id, _ in late)
        return late

    def flush_reason_of(self, entry_id: str) -> str | None:
        """Why the request ran in this batch: the batch's flush reason, or ``late``."""
        return "late" if entry_id in self.late else self.flush_reason

    def start(
        self, consumer: str, member: str, entries: Sequence[Sequence[str]]
    ) -> list[DecodedEntry]:
        """Records the batch as run by ``member``, moves its ``(entry id, request id)``
        ``entries`` to ``consumer`` (restarting their lease: a running batch is never
        reclaimed while it can still finish) and reads their requests from the stream, in
        one round trip. Returns the requests; malformed entries are answered
        ``invalid_input``. An entry no longer in the stream does not run: its request has its
        answer (an earlier delivery, or its cancel, closed it; the answer may have expired
        since: a late redelivery must not run it again)."""
        claimed = self.writer.start_batch(
            self.batch_id, member, consumer, [entry_id for entry_id, _ in entries]
        )
        read = read_entries(claimed, self.model, self.ttl_s)
        self.answers.extend(read.invalid)
        self.dropped.extend(read.dropped)
        return read.decoded

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
