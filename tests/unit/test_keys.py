"""Every Redis key string is pinned: changing one breaks running fleets."""

from config.keys import CONSUMER_GROUP, Keys, device_consumer, held_on_device, worker_consumer


def test_every_key_has_its_exact_string() -> None:
    """Keys are built under one prefix with ':' separators, exactly as documented."""
    keys = Keys("bf")
    assert keys.stream("m") == "bf:m:m:requests"
    assert keys.inflight("m") == "bf:m:m:inflight"
    assert keys.inflight_owners("m") == "bf:m:m:inflight_owners"
    assert keys.slot_free("m") == "bf:m:m:slot_free"
    assert keys.workers("m") == "bf:m:m:workers"
    assert keys.attempts("m") == "bf:m:m:attempts"
    assert keys.batch_cap("m") == "bf:m:m:batch_cap"
    assert keys.dead_letter("m") == "bf:m:m:dead"
    assert keys.record("r1") == "bf:r:r1"
    assert keys.waiters("r1") == "bf:w:r1"
    assert keys.result("r1") == "bf:res:r1"
    assert keys.inbox("p1") == "bf:inbox:p1"
    assert keys.celery_queue("m") == "bf.m"
    assert keys.policies() == "bf:policies"
    assert keys.stats("m") == "bf:m:m:stats"
    assert keys.model_version("m") == "bf:m:m:version"
    assert keys.cache("m", "d1") == "bf:c:m:d1"
    assert CONSUMER_GROUP == "batchers"
    assert worker_consumer("gpu0@h") == "worker:gpu0@h"
    assert device_consumer("gpu0@h", "1a2b") == "worker:gpu0@h:1a2b:device"
    assert held_on_device(device_consumer("gpu0@h", "1a2b"))
    assert not held_on_device(worker_consumer("gpu0@h"))


def test_prefix_separates_fleets() -> None:
    """Two prefixes never share a key, so fleets can share one Redis."""
    assert Keys("a").result("x") != Keys("b").result("x")
    assert Keys("a").stream("m").startswith("a:")
