"""Every Redis key string is pinned: changing one breaks running fleets."""

from redis.crc import key_slot

from config.keys import CONSUMER_GROUP, Keys, device_consumer, held_on_device, worker_consumer


def test_every_key_has_its_exact_string() -> None:
    """Keys are built under one prefix with ':' separators, exactly as documented; a model's
    keys carry its hash tag."""
    keys = Keys("bf")
    assert keys.stream("m") == "bf:{m:m}:requests"
    assert keys.inflight("m") == "bf:{m:m}:inflight"
    assert keys.inflight_owners("m") == "bf:{m:m}:inflight_owners"
    assert keys.slot_free("m") == "bf:{m:m}:slot_free"
    assert keys.workers("m") == "bf:{m:m}:workers"
    assert keys.devices("m") == "bf:{m:m}:devices"
    assert keys.attempts("m") == "bf:{m:m}:attempts"
    assert keys.batch_cap("m") == "bf:{m:m}:batch_cap"
    assert keys.dead_letter("m") == "bf:{m:m}:dead"
    assert keys.record("m", "r1") == "bf:{m:m}:r:r1"
    assert keys.result("m", "r1") == "bf:{m:m}:res:r1"
    assert keys.chunks("m", "r1") == "bf:{m:m}:chunks:r1"
    assert keys.inbox("m", "p1") == "bf:{m:m}:inbox:p1"
    assert keys.model_of("r1") == "bf:model_of:r1"
    assert keys.gateway_batches() == "bf:gw:batches"
    assert keys.gateway_batch("batch_1") == "bf:gw:batch:batch_1"
    assert keys.gateway_batch_lease("batch_1") == "bf:gw:lease:batch_1"
    assert keys.celery_queue("m") == "bf.{m:m}"
    assert keys.policies() == "bf:policies"
    assert keys.stats("m") == "bf:{m:m}:stats"
    assert keys.model_version("m") == "bf:{m:m}:version"
    assert keys.cache("m", "d1") == "bf:{m:m}:c:d1"
    assert CONSUMER_GROUP == "batchers"
    assert worker_consumer("gpu0@h") == "worker:gpu0@h"
    assert device_consumer("gpu0@h", "1a2b") == "worker:gpu0@h:1a2b:device"
    assert held_on_device(device_consumer("gpu0@h", "1a2b"))
    assert not held_on_device(worker_consumer("gpu0@h"))


def test_a_models_keys_share_one_slot_and_models_spread() -> None:
    """On Redis Cluster everything of one model lives in one hash slot, ids and all, while
    different models land on different slots."""
    keys = Keys("bf")
    of_model = {
        key_slot(key.encode())
        for key in (
            keys.stream("m"),
            keys.stats("m"),
            keys.record("m", "r1"),
            keys.result("m", "r2"),
            keys.inbox("m", "p1"),
            keys.cache("m", "d1"),
        )
    }
    assert len(of_model) == 1
    assert len({key_slot(keys.stream(f"model-{n}").encode()) for n in range(20)}) > 15


def test_prefix_separates_fleets() -> None:
    """Two prefixes never share a key, so fleets can share one Redis."""
    assert Keys("a").result("m", "x") != Keys("b").result("m", "x")
    assert Keys("a").stream("m").startswith("a:")
