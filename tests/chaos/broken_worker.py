"""Deliberately broken workers, to prove the ledger sees what it must catch. Run as
``python -m tests.chaos.broken_worker MODE worker --cpu …`` with MODE one of:

- ``ack-on-receipt``: acknowledges a batch's stream entries as the batch starts (once it has
  read them), before any result is written (what ack-on-receipt queues do): killed
  mid-batch, it loses requests;
- ``overwrite``: writes results without "first write wins": a batch delivered twice writes
  a second answer (the finalize script's source, as the registry hands it out, loses ``NX``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from config import lua
from config.keys import CONSUMER_GROUP
from workers.cli.main import main
from workers.protocol.results import ResultWriter

start_batch = ResultWriter.start_batch
script_source = lua.source


def ack_on_receipt(
    self: ResultWriter,
    batch_id: str,
    member: str,
    consumer: str,
    entry_ids: Sequence[str],
) -> list[Any]:
    started = start_batch(self, batch_id, member, consumer, entry_ids)
    if entry_ids:
        self._client.xack(self._keys.stream(self._model), CONSUMER_GROUP, *entry_ids)
    return started


def overwriting_source(name: str) -> str:
    """The scripts' sources, with the finalize script writing whether or not a result exists."""
    text = script_source(name)
    if name != "finalize":
        return text
    if "'NX', " not in text:
        sys.exit("overwrite: the finalize script no longer writes with 'NX'")
    return text.replace("'NX', ", "")


if __name__ == "__main__":
    mode = sys.argv.pop(1)
    if mode == "ack-on-receipt":
        ResultWriter.start_batch = ack_on_receipt  # type: ignore[method-assign]
    elif mode == "overwrite":
        lua.source = overwriting_source  # type: ignore[assignment]
    else:
        sys.exit(f"unknown mode {mode!r}")
    sys.exit(main())
