"""Bad input against the real services: refused at the edge, or answered, never fatal."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import pytest
import redis
from kombu import Connection

from config.errors import QueueFull, RequestIdConflict, UnknownRequest
from config.keys import Keys
from config.schema import STREAM_FIELD, Result
from producer.admission import ProducerCore
from workers.celery_app import RUN_BATCH_TASK
from workers.local_fleet import LocalFleet

from .conftest import FleetEnv, producer_for, settings_for, wait_ready


def test_admission_script_on_real_redis(make_fleet: Callable[..., LocalFleet]) -> None:
    """The admission Lua behaves on real Redis as on fakeredis: dedupe, conflict, queue cap."""
    fleet = make_fleet(BATCHFLEET_MODELS__SYNTHETIC__MAX_QUEUE_LEN="3")
    with producer_for(fleet) as producer:
        assert producer.submit("synthetic", "a", request_id="same") == "same"
        assert producer.submit("synthetic", "a", request_id="same") == "same"
        with pytest.raises(RequestIdConflict):
            producer.submit("synthetic", "b", request_id="same")
        producer.submit_many("synthetic", ["c", "d"])
        started = time.monotonic()
        with pytest.raises(QueueFull):
            producer.submit("synthetic", "e")
        assert time.monotonic() - started < 1.0, "a full queue must refuse fast"
        with pytest.raises(UnknownRequest):
            producer.result("never-submitted", timeout_s=30)


def test_malformed_stream_entry_becomes_an_error_result(
    make_fleet: Callable[..., LocalFleet], redis_client: redis.Redis
) -> None:
    """An entry written by hand is answered invalid_input; the fleet keeps serving."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    keys = Keys(fleet.env["BATCHFLEET_KEY_PREFIX"])
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        redis_client.xadd(
            keys.requests("synthetic"),
            {STREAM_FIELD: json.dumps({"request_id": "hand-written", "input": "x"})},
        )
        redis_client.xadd(keys.requests("synthetic"), {STREAM_FIELD: "\xff garbage"})
        # Barrier: the batcher reads in order, so a later request done means both were handled.
        assert producer.infer("synthetic", ["after"], timeout_s=30)
    raw = redis_client.get(keys.result("hand-written"))
    assert raw is not None
    error = Result.decode(raw).error
    assert error is not None and error.code == "invalid_input"
    assert redis_client.xlen(keys.requests("synthetic")) == 0


def test_non_json_celery_message_is_rejected_never_executed(
    make_fleet: Callable[..., LocalFleet], fleet_env: FleetEnv, redis_client: redis.Redis
) -> None:
    """A pickle message on the batch queue is refused by the worker; its batch never runs."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    settings = settings_for(fleet_env)
    keys = Keys(settings.key_prefix)
    prepared = ProducerCore(settings).prepare("synthetic", "smuggled")
    request = prepared.request
    redis_client.set(keys.request(request.request_id), request.digest, ex=60)
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        with Connection(fleet_env["BATCHFLEET_REDIS_URL"]) as connection:
            connection.Producer().publish(
                [["synthetic", "evil", [["0-1", request.encode()]]], {}, {}],
                routing_key=keys.celery_queue("synthetic"),
                serializer="pickle",
                headers={"task": RUN_BATCH_TASK, "id": str(uuid.uuid4()), "lang": "py"},
            )
        # Barrier: later batches on the same queue complete, so the worker has seen the message.
        assert producer.infer("synthetic", list(range(40)), timeout_s=30)
    assert redis_client.get(keys.result(request.request_id)) is None
    assert "pickle" in fleet.logs()
