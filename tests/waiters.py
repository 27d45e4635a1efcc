"""Whether a producer waits for a request, read from where the fleet keeps its waiters: the
request's admission record names the inbox of each producer waiting for its answer, one line
each (``config/lua/waiters.lua``)."""

from __future__ import annotations


def names_waiter(record: bytes | None, inbox: str) -> bool:
    """Whether the admission ``record`` (as read from Redis) names ``inbox`` as a waiter."""
    return record is not None and inbox.encode() in record.split(b"\n")[1:]
