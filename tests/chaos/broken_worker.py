"""A deliberately broken worker, to prove the ledger sees loss: it acknowledges a batch's stream
entries when the batch starts, before any result is written (what celery-batches-style
ack-on-receipt does). Run as ``python -m tests.chaos.broken_worker worker --cpu``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from config.keys import CONSUMER_GROUP
from workers import cli
from workers.results import ResultWriter

claim_and_check = ResultWriter.claim_and_check


def ack_on_receipt(
    self: ResultWriter, consumer: str, entry_ids: Sequence[str], request_ids: Sequence[str]
) -> list[bool]:
    if entry_ids:
        stream = self._keys.requests(self._model)
        self._client.xack(stream, CONSUMER_GROUP, *entry_ids)
    return claim_and_check(self, consumer, entry_ids, request_ids)


if __name__ == "__main__":
    ResultWriter.claim_and_check = ack_on_receipt  # type: ignore[method-assign]
    sys.exit(cli.main())
