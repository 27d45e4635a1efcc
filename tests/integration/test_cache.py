"""The response cache: a repeated input is answered at submit without entering the queue,
counted, and a new model version starts with an empty cache."""

from __future__ import annotations

import json
from collections.abc import Callable

import redis

from config.keys import Keys
from producer.client import Producer
from tests.chaos.harness import wait_until
from workers.batcher.metrics import batcher_registry
from workers.local.local_fleet import LocalFleet
from workers.models.synthetic import expected_output

from .conftest import producer_for, settings_for, wait_ready


def test_a_repeated_input_is_answered_from_the_cache_until_the_model_version_changes(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    policy = {"synthetic": {"cache_ttl_s": 60, "options": {"version": "v1"}}}
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps(policy))
    fleet.start("batcher")
    worker = fleet.start("worker", "--cpu")
    settings = settings_for(fleet.env)
    keys = Keys(settings.key_prefix)
    client = redis.Redis.from_url(settings.redis_url.get_secret_value())
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        (first,) = list(producer.results([producer.submit("synthetic", {"q": "same"})]))
        last_entry = client.xinfo_stream(keys.stream("synthetic"))["last-generated-id"]
        (again,) = list(producer.results([producer.submit("synthetic", {"q": "same"})]))
        assert client.xinfo_stream(keys.stream("synthetic"))["last-generated-id"] == last_entry
        assert not first.cached and again.cached
        assert again.output == first.output == expected_output({"q": "same"})
        assert again.model_version == "v1" and again.batch_id is None

        fleet.stop(worker)
        fleet.env["BATCHFLEET_MODELS"] = json.dumps(
            {"synthetic": {"cache_ttl_s": 60, "options": {"version": "v2"}}}
        )
        fleet.start("worker", "--cpu")
        wait_ready(producer, fleet, warmup={"warm": "v2"})
        (fresh,) = list(producer.results([producer.submit("synthetic", {"q": "same"})]))
        assert not fresh.cached and fresh.model_version == "v2"
    stats = client.hgetall(keys.stats("synthetic"))
    assert int(stats[b"cache:hit"]) == 1
    metrics = batcher_registry(client, keys, ["synthetic"])
    hits = metrics.get_sample_value(
        "batchfleet_cache_requests_total", {"model": "synthetic", "result": "hit"}
    )
    assert hits == 1
    client.close()


def test_a_producer_with_only_the_redis_url_gets_the_fleets_cache(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """The cache is configured for the batcher and the worker only; a producer that knows
    nothing but where Redis is still has the same input answered from it."""
    policy = {"synthetic": {"cache_ttl_s": 60}}
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps(policy))
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    bare_env = {k: v for k, v in fleet.env.items() if k.startswith("BATCHFLEET_")}
    bare_env.pop("BATCHFLEET_MODELS")
    settings = settings_for(bare_env)
    client = redis.Redis.from_url(settings.redis_url.get_secret_value())
    wait_until(lambda: client.hexists(Keys(settings.key_prefix).policies(), "synthetic"))
    client.close()
    with Producer(settings) as producer:
        wait_ready(producer, fleet)
        answers = []
        for _ in range(3):
            (answer,) = producer.results([producer.submit("synthetic", {"q": "again"})])
            answers.append(answer)
        assert producer.policy("synthetic").cache_ttl_s == 60
    assert [answer.cached for answer in answers] == [False, True, True]
