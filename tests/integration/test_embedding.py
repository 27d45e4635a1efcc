"""The real embedding model served by a real fleet (when the embedding extra is installed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from config.schema import Result
from config.settings import ModelPolicy
from workers.local.local_fleet import LocalFleet
from workers.models.base import outputs_of
from workers.models.registry import build_model
from workers.tools.bench_inputs import sentence_inputs

from .conftest import producer_for, wait_ready
from .test_cli import row, run_cli

pytest.importorskip("torch", reason="the embedding extra is not installed")

POLICY = {"backend": "embedding", "options": {"threads": 1}}


def embed_through_fleet(
    make_fleet: Callable[..., LocalFleet], policy: dict[str, Any], inputs: list[Any]
) -> tuple[list[str], dict[str, Result]]:
    """Starts a batcher and a CPU worker serving ``policy`` as ``embed``, sends ``inputs`` at
    once; their ids and final results."""
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps({"embed": policy}))
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet, "embed", warmup="warm up")
        ids = producer.submit_many("embed", inputs)
        results = {result.request_id: result for result in producer.results(ids, timeout_s=120)}
    return ids, results


def assert_own_vectors(ids: list[str], results: dict[str, Result], sentences: list[str]) -> None:
    """Each caller got the vector the model computes for its own sentence."""
    local = build_model("embed", ModelPolicy.model_validate(POLICY), "cpu")
    for request_id, vector in zip(ids, outputs_of(local, sentences), strict=True):
        output = results[request_id].unwrap()
        assert sum(x * y for x, y in zip(output, vector, strict=True)) > 0.9999


def test_a_fleet_embeds_sentences_in_batches_and_isolates_a_bad_input(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """Sentences sent at once come back as the model's own vectors, each to its caller, from
    batches of many; an input that is not a string gets invalid_input and harms no one."""
    sentences = [sentence_inputs(seed=7)(index) for index in range(96)]
    ids, results = embed_through_fleet(make_fleet, POLICY, [*sentences[:50], 42, *sentences[50:]])
    bad_id = ids.pop(50)
    assert results[bad_id].error is not None
    assert results[bad_id].error.code == "invalid_input"
    assert "non-empty string" in results[bad_id].error.message
    assert_own_vectors(ids, results, sentences)
    assert max(results[request_id].batch_size for request_id in ids) > 8


def test_a_fleet_batching_by_tokens_answers_all_and_refuses_an_input_over_the_budget(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """With batches grouped by token count under a token budget, every sentence gets its own
    vector, and a text longer than the whole budget is answered invalid_input at once."""
    policy = {**POLICY, "group_by_cost": True, "max_batch_cost": 200}
    sentences = [sentence_inputs(seed=11)(index) for index in range(64)]
    ids, results = embed_through_fleet(make_fleet, policy, [*sentences, "word " * 500])
    too_long = results[ids.pop()].error
    assert too_long is not None and too_long.code == "invalid_input"
    assert "over the model's max_batch_cost of 200" in too_long.message
    assert_own_vectors(ids, results, sentences)
    assert {results[request_id].model_version for request_id in ids} == {"all-MiniLM-L6-v2/1"}
    assert max(results[request_id].batch_size for request_id in ids) > 4


def test_the_demo_embeds_real_sentences_through_the_fleet() -> None:
    """`batchfleet demo --model embedding` answers every sentence and reports batches."""
    done = run_cli("demo", "--model", "embedding", "--requests", "96", "--baseline", "16")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    batched = row(next(line for line in lines if line.startswith("batched")))
    single = row(next(line for line in lines if line.startswith("one at a time")))
    assert batched["done"] == "96/96" and single["done"] == "16/16"
    assert float(batched["batch"]) > 1
    assert "all-MiniLM-L6-v2" in lines[0]
