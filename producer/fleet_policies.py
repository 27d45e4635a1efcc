"""Which models the fleet serves, and how: a producer follows its batchers' policies.

Each batcher publishes the policy of every model it serves in ``bf:policies``. A producer reads
them at most every ``REFRESH_S`` and admits by them (queue cap, input size, deadlines,
priorities, response cache), so that one started with nothing but ``BATCHFLEET_REDIS_URL``
serves the fleet's models as the fleet does. A model only the producer's configuration names
keeps that policy. Where the producer was configured with other values for a model the fleet
serves, it says so once and follows the fleet. I/O-free: the clients read the hash.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import ValidationError

from config.published_policy import PUBLISHED_FIELDS, decode_policy
from config.settings import ModelPolicy, Settings

log = logging.getLogger(__name__)

REFRESH_S = 5.0


def differences(own: ModelPolicy, fleet: ModelPolicy) -> str:
    """``"cache_ttl_s: None here, 60.0 in the fleet; …"``."""
    return "; ".join(
        f"{name}: {getattr(own, name)!r} here, {getattr(fleet, name)!r} in the fleet"
        for name in PUBLISHED_FIELDS
        if getattr(own, name) != getattr(fleet, name)
    )


class FleetPolicies:
    """A producer's model policies: the fleet's, over its own configuration."""

    def __init__(self, settings: Settings) -> None:
        self._own = dict(settings.models)
        self._configured = "models" in settings.model_fields_set
        self.models: dict[str, ModelPolicy] = dict(settings.models)
        self._read_at = float("-inf")
        self._warned: set[tuple[str, str]] = set()

    def due(self, now: float) -> bool:
        """Whether the fleet's policies are to be read again (``now``: monotonic seconds)."""
        return now - self._read_at >= REFRESH_S

    def followed(self) -> bool:
        """Whether the fleet's policies were read once: a refresh that cannot reach Redis
        then keeps them instead of holding admission (on a Redis Cluster, the node that holds
        ``bf:policies`` may be down while a model's own node serves)."""
        return self._read_at != float("-inf")

    def postpone(self, now: float) -> None:
        """Keeps the policies read last until ``REFRESH_S`` after ``now``."""
        self._read_at = now

    def adopt(self, published: Mapping[bytes | str, bytes | str], now: float) -> None:
        """Follows the policies the fleet published (``bf:policies``, read at ``now``)."""
        self._read_at = now
        fleet: dict[str, ModelPolicy] = {}
        for raw_name, raw_policy in published.items():
            model = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else raw_name
            try:
                fleet[model] = decode_policy(raw_policy)
            except ValidationError as exc:
                self._warn_once(
                    ("unreadable", model),
                    f"model {model}: the fleet's policy cannot be read ({exc.error_count()} "
                    "errors, a newer batcher?); following this producer's",
                )
                continue
            own = self._own.get(model)
            differ = differences(own, fleet[model]) if self._configured and own else ""
            if differ:
                self._warn_once(
                    ("differs", model),
                    f"model {model}: this producer's configuration differs from the fleet's "
                    f"({differ}); following the fleet",
                )
        self.models = {**self._own, **fleet}

    def _warn_once(self, topic: tuple[str, str], message: str) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning("%s", message)
