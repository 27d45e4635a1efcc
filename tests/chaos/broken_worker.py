"""Deliberately broken workers, to prove the ledger sees what it must catch. Run as
``python -m tests.chaos.broken_worker MODE worker --cpu …`` with MODE one of:

- ``ack-on-receipt``: acknowledges a batch's stream entries when the batch starts, before any
  result is written (what ack-on-receipt queues do): killed mid-batch, it loses requests;
- ``overwrite``: writes results without "first write wins": a batch delivered twice writes
  a second answer.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from config.keys import CONSUMER_GROUP
from workers.cli.main import main
from workers.protocol import results
from workers.protocol.results import ResultWriter

claim_and_check = ResultWriter.claim_and_check


def ack_on_receipt(
    self: ResultWriter, consumer: str, entry_ids: Sequence[str], request_ids: Sequence[str]
) -> list[bool]:
    if entry_ids:
        self._client.xack(self._keys.requests(self._model), CONSUMER_GROUP, *entry_ids)
    return claim_and_check(self, consumer, entry_ids, request_ids)


if __name__ == "__main__":
    mode = sys.argv.pop(1)
    if mode == "ack-on-receipt":
        ResultWriter.claim_and_check = ack_on_receipt  # type: ignore[method-assign]
    elif mode == "overwrite":
        results.FINALIZE_SCRIPT = results.FINALIZE_SCRIPT.replace("'NX', ", "")
    else:
        sys.exit(f"unknown mode {mode!r}")
    sys.exit(main())
