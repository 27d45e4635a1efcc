"""The field names of a model's stats hash (``Keys.stats``): a wire format that producers,
batchers and workers write (the Lua scripts get them through ARGV) and the metrics and
``batchfleet top`` read.

==========================  ===============================================================
field                       counts
==========================  ===============================================================
``accepted``                requests admitted to the queue
``refused:{reason}``        requests refused at submit (``RequestRejected.reason``)
``completed``               requests answered with an output
``failed:{code}``           requests answered with an error (``ErrorInfo.code``)
``batches:{flush reason}``  batches the batchers sent, by why they were sent
``cache:hit``               submits answered from the response cache
``cache:miss``              submits the response cache could not answer
==========================  ===============================================================
"""

from __future__ import annotations

SEPARATOR = ":"

# The kinds of field: the name itself, or its part before the separator.
ACCEPTED = "accepted"
COMPLETED = "completed"
REFUSED = "refused"
FAILED = "failed"
BATCHES = "batches"
CACHE = "cache"
# The kinds that carry a label after the separator.
LABELLED = (REFUSED, FAILED, BATCHES, CACHE)


def refused(reason: str) -> str:
    """Counts requests refused at submit for ``reason``."""
    return f"{REFUSED}{SEPARATOR}{reason}"


def failed(code: str) -> str:
    """Counts requests answered with the error ``code``."""
    return f"{FAILED}{SEPARATOR}{code}"


def batches(flush_reason: str) -> str:
    """Counts batches sent for ``flush_reason``."""
    return f"{BATCHES}{SEPARATOR}{flush_reason}"


CACHE_HIT = f"{CACHE}{SEPARATOR}hit"
CACHE_MISS = f"{CACHE}{SEPARATOR}miss"


def parse(field: str) -> tuple[str, str]:
    """A field's kind and label (``''`` for ``accepted`` and ``completed``)."""
    kind, _, label = field.partition(SEPARATOR)
    return kind, label
