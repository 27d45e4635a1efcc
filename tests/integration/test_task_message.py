"""The batch task message the dispatch script pushes is the one Celery's ``send_task`` writes,
its body as JSON text instead of base64: a Celery or kombu upgrade that changes the format
fails here, not in a fleet whose workers would then drop or misread every batch."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis
from celery import Celery

from config.batch_task import RUN_BATCH_TASK, BatchTask
from config.keys import Keys
from workers.protocol.celery_app import make_celery_app
from workers.protocol.task_message import EMBED, batch_message

from .conftest import FleetEnv, settings_for

# Fields that name one message, not its kind: they differ between any two messages.
PER_MESSAGE_HEADERS = ("id", "root_id")
PER_MESSAGE_PROPERTIES = ("correlation_id", "delivery_tag")
TASK = BatchTask("synthetic", "b1", [("1-0", '{"request_id": "r1"}')], "size")


@pytest.fixture
def app(fleet_env: FleetEnv) -> Celery:
    return make_celery_app(settings_for(fleet_env))


@pytest.fixture
def queue(fleet_env: FleetEnv) -> str:
    return Keys(settings_for(fleet_env).key_prefix).celery_queue("synthetic")


def without(fields: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if name not in names}


def test_the_dispatched_message_is_the_one_send_task_writes(
    app: Celery, queue: str, redis_client: redis.Redis
) -> None:
    """Same body, headers and properties as Celery's own message for the batch on a Redis
    broker, but for the ids, the reply queue (results the batch task never returns) and the
    body's encoding (none: the body is the JSON itself)."""
    with app.connection_for_write() as connection:
        app.send_task(
            RUN_BATCH_TASK,
            args=TASK.args(),
            queue=queue,
            argsrepr=TASK.argsrepr(),
            connection=connection,
        )
    sent = json.loads(redis_client.rpop(queue) or b"null")
    ours = json.loads(batch_message(TASK, queue))

    assert ours.keys() == sent.keys()
    assert json.loads(ours["body"]) == json.loads(base64.b64decode(sent["body"]))
    assert without(ours, ("body", "headers", "properties")) == without(
        sent, ("body", "headers", "properties")
    )
    assert without(ours["headers"], PER_MESSAGE_HEADERS) == without(
        sent["headers"], PER_MESSAGE_HEADERS
    )
    assert without(ours["properties"], PER_MESSAGE_PROPERTIES) == without(
        sent["properties"], (*PER_MESSAGE_PROPERTIES, "reply_to", "body_encoding")
    )
    headers, properties = ours["headers"], ours["properties"]
    assert headers["id"] == headers["root_id"] == properties["correlation_id"]
    assert properties["delivery_tag"] != headers["id"]


def test_a_worker_reads_the_dispatched_body_as_it_is(app: Celery, queue: str) -> None:
    """kombu's Redis transport, as a worker's consumer builds the message it pops, decodes our
    body (no ``body_encoding``) to the task's arguments: a kombu that required base64 would
    misread every batch, and fails here."""
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        message = channel.Message(json.loads(batch_message(TASK, queue)), channel=channel)
        assert message.decode() == [TASK.args(), {}, EMBED]
