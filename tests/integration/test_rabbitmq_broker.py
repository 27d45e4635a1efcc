"""The batch hop on a broker of its own: RabbitMQ carries the batches, Redis keeps the request
path. Uses the RabbitMQ named by ``AMQP_TEST_URL`` (``.ci/run`` points it at the machine's;
unset, a RabbitMQ on loopback with its default guest user), and skips, saying why, where none
can be reached."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import redis
from kombu import Connection

from config.keys import Keys
from workers.local.local_fleet import LocalFleet
from workers.models.synthetic import expected_output

from .conftest import FleetEnv, check_outputs, producer_for, settings_for, wait_ready

AMQP_URL = os.environ.get("AMQP_TEST_URL") or "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def amqp_url(fleet_env: FleetEnv) -> Iterator[str]:
    """The test RabbitMQ's URL; the queue and exchanges this test's fleet declared are
    deleted after it (ask for this fixture before ``make_fleet``: it is torn down after the
    fleet has stopped)."""
    try:
        with Connection(AMQP_URL, connect_timeout=5) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        pytest.skip(f"no RabbitMQ at {AMQP_URL.split('@')[-1]} (set AMQP_TEST_URL): {exc}")
    yield AMQP_URL
    prefix = fleet_env["BATCHFLEET_KEY_PREFIX"]
    with Connection(AMQP_URL, connect_timeout=5) as connection:
        channel = connection.default_channel
        queue = Keys(prefix).celery_queue("synthetic")
        channel.queue_delete(queue)
        for exchange in (queue, f"{prefix}.celeryev", f"{prefix}.pidbox"):
            channel.exchange_delete(exchange)


def test_a_fleet_with_rabbitmq_as_its_broker_answers_every_request(
    amqp_url: str, make_fleet: Callable[..., LocalFleet], redis_client: redis.Redis
) -> None:
    """With ``BATCHFLEET_BROKER_URL`` on RabbitMQ, 1,000 requests each get their own answer
    in real batches, and no batch passes through Redis."""
    fleet = make_fleet(BATCHFLEET_BROKER_URL=amqp_url)
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        inputs = [{"n": index} for index in range(1000)]
        ids = producer.submit_many("synthetic", inputs)
        results = {result.request_id: result for result in producer.results(ids, timeout_s=120)}
    check_outputs(
        {request_id: result.output for request_id, result in results.items()},
        {request_id: expected_output(value) for request_id, value in zip(ids, inputs, strict=True)},
    )
    assert len({result.batch_id for result in results.values()}) < len(ids) / 4
    settings = settings_for(fleet.env)
    assert not redis_client.exists(Keys(settings.key_prefix).celery_queue("synthetic"))
    assert not redis_client.exists("unacked")
