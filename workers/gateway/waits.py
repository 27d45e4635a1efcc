"""How long the gateway waits for a model's answer: the model's own request lifetime and a
little more, so a call for a quick model is not held to the slowest model's timeout."""

from __future__ import annotations

from producer.async_client import AsyncProducer

# Past the request's deadline, the time its batch may still take to run and answer.
ANSWER_SLACK_S = 5.0


async def answer_wait_s(producer: AsyncProducer, model: str) -> float:
    """Raises ``UnknownModel`` for a model the fleet does not serve."""
    policy = await producer.policy(model)
    return policy.request_timeout_s + ANSWER_SLACK_S
