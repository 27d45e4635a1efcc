"""The model policy a batcher publishes for producers in ``bf:policies``: every field of
``ModelPolicy`` but the backend and its options, which only workers use (and which may name
credentials)."""

from __future__ import annotations

from config.settings import ModelPolicy

WORKER_ONLY_FIELDS = frozenset({"backend", "options"})
PUBLISHED_FIELDS = tuple(
    name for name in ModelPolicy.model_fields if name not in WORKER_ONLY_FIELDS
)


def encode_policy(policy: ModelPolicy) -> str:
    """The JSON a batcher publishes for ``policy``."""
    return policy.model_dump_json(exclude=set(WORKER_ONLY_FIELDS))


def decode_policy(raw: bytes | str) -> ModelPolicy:
    """The policy a producer admits by (backend and options at their defaults).

    Raises:
        pydantic.ValidationError: the JSON is not a policy this release knows.
    """
    return ModelPolicy.model_validate_json(raw)
