"""Streaming past the batcher: chunks reach the caller in order as the upstream produces them,
the complete text becomes the result, and a caller that goes away stops the upstream call."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import pytest

from config.errors import InvalidInput, RequestCancelled
from producer.async_client import AsyncProducer
from workers.local.local_fleet import LocalFleet

from .conftest import producer_for, settings_for, wait_ready
from .openai_server import FakeUpstream


@pytest.fixture
def chat_fleet(make_fleet: Callable[..., LocalFleet]) -> Iterator[tuple[LocalFleet, FakeUpstream]]:
    """A batcher and a worker serving ``chat`` from a loopback OpenAI-compatible server."""
    with FakeUpstream() as upstream:
        options = {"base_url": upstream.url, "model": "m", "endpoint": "chat"}
        fleet = make_fleet(
            BATCHFLEET_MODELS=json.dumps({"chat": {"backend": "openai", "options": options}})
        )
        fleet.start("batcher")
        fleet.start("worker", "--cpu")
        with producer_for(fleet) as producer:
            wait_ready(producer, fleet, "chat", warmup="warm up")
        yield fleet, upstream


def test_chunks_arrive_in_order_and_the_complete_text_is_the_result(
    chat_fleet: tuple[LocalFleet, FakeUpstream],
) -> None:
    fleet, _ = chat_fleet
    with producer_for(fleet) as producer:
        chunks = list(producer.stream("chat", "count:5", request_id="s1"))
        result = next(producer.results(["s1"], timeout_s=10))
    assert [chunk["delta"] for chunk in chunks[:-1]] == ["w1 ", "w2 ", "w3 ", "w4 ", "w5 "]
    final = chunks[-1]
    assert (
        final["final"] and final["text"] == "w1 w2 w3 w4 w5 " and final["finish_reason"] == "stop"
    )
    assert final["usage"] == {"completion_tokens": 5}
    assert result.output == {
        "text": "w1 w2 w3 w4 w5 ",
        "finish_reason": "stop",
        "usage": {"completion_tokens": 5},
    }
    assert result.flush_reason == "stream" and result.batch_id is None


def test_a_caller_that_goes_away_stops_the_upstream_call(
    chat_fleet: tuple[LocalFleet, FakeUpstream],
) -> None:
    fleet, upstream = chat_fleet
    with producer_for(fleet) as producer:
        for index, _chunk in enumerate(producer.stream("chat", "count:500", request_id="s2")):
            if index == 2:
                break
        give_up = time.monotonic() + 20
        while upstream.streams_cut == 0:
            assert time.monotonic() < give_up, "the upstream call went on"
            time.sleep(0.05)
        with pytest.raises(RequestCancelled):
            producer.result("s2", timeout_s=10)
    assert upstream.words_sent < 100


def test_the_async_producer_streams_the_same(chat_fleet: tuple[LocalFleet, FakeUpstream]) -> None:
    fleet, _ = chat_fleet

    async def collect() -> list[dict[str, object]]:
        async with AsyncProducer(settings_for(fleet.env)) as producer:
            return [chunk async for chunk in producer.stream("chat", "count:3")]

    chunks = asyncio.run(collect())
    assert "".join(str(chunk.get("delta", "")) for chunk in chunks) == "w1 w2 w3 "
    assert chunks[-1]["final"]


def test_a_stream_cancelled_elsewhere_ends_its_callers_loop_with_request_cancelled(
    chat_fleet: tuple[LocalFleet, FakeUpstream],
) -> None:
    fleet, upstream = chat_fleet
    with producer_for(fleet) as producer, producer_for(fleet) as other:
        chunks = producer.stream("chat", "count:500", request_id="s3")
        assert next(chunks)["delta"] == "w1 "
        assert other.cancel("s3") is True
        with pytest.raises(RequestCancelled):
            for _chunk in chunks:
                pass
    assert upstream.words_sent < 200, "the loop ran on with the upstream after the cancel"


def test_a_model_that_cannot_stream_is_refused(make_fleet: Callable[..., LocalFleet]) -> None:
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        with pytest.raises(InvalidInput, match="does not stream"):
            producer.stream("synthetic", "x")
