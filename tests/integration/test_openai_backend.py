"""The ``openai`` backend against an OpenAI-compatible server on loopback that fails on demand."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from config.settings import ModelPolicy
from workers.local.local_fleet import LocalFleet
from workers.models.base import ItemError
from workers.models.openai_http import OpenAIModel
from workers.models.registry import build_model

from .conftest import producer_for, wait_ready
from .openai_server import FakeUpstream

KEY = "sk-test-do-not-log"


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    monkeypatch.setenv("UPSTREAM_KEY", KEY)
    with FakeUpstream() as server:
        yield server


def backend(upstream: FakeUpstream, endpoint: str, **options: Any) -> OpenAIModel:
    policy = ModelPolicy(
        backend="openai",
        options={
            "base_url": upstream.url,
            "model": "m",
            "endpoint": endpoint,
            "api_key_env": "UPSTREAM_KEY",
            "backoff_s": 0.01,
            **options,
        },
    )
    model = build_model("up", policy, "cpu")
    assert isinstance(model, OpenAIModel)
    return model


def errors(outputs: list[Any]) -> dict[int, str]:
    return {i: out.message for i, out in enumerate(outputs) if isinstance(out, ItemError)}


def test_embeddings_take_the_whole_batch_in_one_call(upstream: FakeUpstream) -> None:
    """One call per batch, vectors in the caller's order, the API key sent as a bearer."""
    outputs = backend(upstream, "embeddings").predict(["a", "bbb", "cc"])
    assert outputs == [[1.0, 0.0], [3.0, 1.0], [2.0, 2.0]]
    assert upstream.calls == {"/v1/embeddings": 1}
    assert upstream.authorizations == [f"Bearer {KEY}"]


def test_an_answer_missing_for_an_input_is_its_error_never_a_shifted_vector(
    upstream: FakeUpstream,
) -> None:
    """An upstream that returns fewer vectors than inputs: the missing one is an ItemError,
    and a non-string input fails alone without reaching the upstream."""
    outputs = backend(upstream, "embeddings").predict(["a", 7, "bb", "short"])
    assert outputs[0] == [1.0, 0.0] and outputs[2] == [2.0, 1.0]
    assert errors(outputs) == {
        1: "input must be a non-empty string",
        3: "the upstream returned no embedding for this input",
    }


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_generation_fans_out_one_call_per_input_within_max_concurrency(
    upstream: FakeUpstream, endpoint: str
) -> None:
    """Chat and completions run one call per input, several at once but never more than
    max_concurrency, each with its text and usage, in order."""
    prompts = [f"slow:0.05 {i}" for i in range(12)]
    outputs = backend(upstream, endpoint, max_concurrency=4).predict(prompts)
    assert [output["text"] for output in outputs] == [f"echo: {p}" for p in prompts]
    assert outputs[0]["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert 1 < upstream.most_in_flight <= 4


def test_429s_and_5xx_are_retried_and_only_the_hopeless_input_fails(
    upstream: FakeUpstream,
) -> None:
    """Two 429s (Retry-After honoured) and a 500 are retried to success; an input whose 500s
    outlast max_retries fails alone, the others of its batch succeed."""
    model = backend(upstream, "chat", max_retries=3)
    outputs = model.predict(["fail-429:2:a", "fail-500:1:b", "fail-500:9:c", "fine"])
    assert [out["text"] for out in outputs if not isinstance(out, ItemError)] == [
        "echo: fail-429:2:a",
        "echo: fail-500:1:b",
        "echo: fine",
    ]
    assert errors(outputs) == {2: "upstream failed after 4 attempt(s): HTTP 500"}


def test_a_429_storm_is_ridden_out(upstream: FakeUpstream) -> None:
    """Thirty 429s in a row across a batch of 16 calls: every call still succeeds."""
    upstream.storm = 30
    outputs = backend(upstream, "completions", max_retries=10, max_concurrency=4).predict(
        [f"p{i}" for i in range(16)]
    )
    assert not errors(outputs)
    assert upstream.storm == 0


def test_malformed_and_slow_answers_fail_their_input_with_a_clear_error(
    upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """Invalid JSON and an answer slower than the timeout are errors for those inputs only;
    no error message or log line carries the API key."""
    caplog.set_level(logging.DEBUG)
    model = backend(upstream, "chat", timeout_s=0.2, max_retries=1)
    outputs = model.predict(["malformed", "slow:1", "fine"])
    found = errors(outputs)
    assert found[0].startswith("the upstream's answer is not JSON")
    assert found[1] == "upstream failed after 2 attempt(s): ReadTimeout: timed out"
    assert outputs[2]["text"] == "echo: fine"
    assert KEY not in caplog.text and KEY not in json.dumps(found)


def test_an_upstream_that_echoes_the_key_has_it_masked(upstream: FakeUpstream) -> None:
    """An error body that repeats the Authorization header reaches the caller masked."""
    (refused,) = backend(upstream, "chat").predict(["echo-key-400"])
    assert isinstance(refused, ItemError)
    assert refused.message == "HTTP 400: bad request from Bearer ***"


def test_a_batch_shares_one_budget_across_its_calls_and_retries(upstream: FakeUpstream) -> None:
    """Slow answers cannot hold a batch past budget_s: each call's timeout shrinks to what is
    left, and the calls still queued when it is spent fail without being sent, so the worker's
    time limits are never reached."""
    model = backend(upstream, "chat", budget_s=0.5, timeout_s=0.3, max_concurrency=2)
    messages = list(errors(model.predict([f"slow:2 {i}" for i in range(6)])).values())
    assert len(messages) == 6
    assert any("ReadTimeout" in message for message in messages)
    assert any("budget_s was spent" in message for message in messages)


def test_a_fleet_serves_an_openai_upstream(
    upstream: FakeUpstream, make_fleet: Callable[..., LocalFleet]
) -> None:
    """Through a real batcher and worker: embeddings batched into few calls, each caller its
    own vector; an input the upstream cannot take is invalid_input for its caller alone."""
    options = {"base_url": upstream.url, "model": "m", "api_key_env": "UPSTREAM_KEY"}
    policy = {"backend": "openai", "options": options}
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps({"up": policy}), UPSTREAM_KEY=KEY)
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    texts = ["x" * (i + 1) for i in range(40)]
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet, "up", warmup="warm")
        ids = producer.submit_many("up", [*texts, 5])
        results = {r.request_id: r for r in producer.results(ids, timeout_s=60)}
    assert [results[i].unwrap()[0] for i in ids[:-1]] == [float(len(t)) for t in texts]
    error = results[ids[-1]].error
    assert error is not None and error.code == "invalid_input"
    assert upstream.calls["/v1/embeddings"] < 20
    assert KEY not in fleet.logs()
