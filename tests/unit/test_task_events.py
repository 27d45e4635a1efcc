"""The worker's task events: none is lost when one is buffered while the buffer is being
published (what Flower shows of each batch depends on all of them)."""

from __future__ import annotations

from typing import Any

from config.settings import Settings
from workers.protocol.celery_app import make_celery_app


class PublishingOnce:
    """A producer whose first publish has another task event buffered while it writes, as a
    pool thread finishing a batch does while the worker's loop publishes."""

    def __init__(self) -> None:
        self.published: list[str] = []
        self.while_writing: Any = None

    def publish(self, body: list[dict[str, Any]], **_: Any) -> None:
        self.published += [event["uuid"] for event in body]
        buffer_another, self.while_writing = self.while_writing, None
        if buffer_another is not None:
            buffer_another()


def test_an_event_buffered_while_the_buffer_is_published_is_published_next(
    settings: Settings,
) -> None:
    dispatcher = make_celery_app(settings).events.Dispatcher(
        hostname="w@test", enabled=False, buffer_group=["task"]
    )
    producer = PublishingOnce()
    dispatcher.producer, dispatcher.enabled = producer, True
    dispatcher.send("task-started", uuid="batch-1")
    producer.while_writing = lambda: dispatcher.send("task-succeeded", uuid="batch-1-done")
    dispatcher.flush()
    dispatcher.flush()
    assert producer.published == ["batch-1", "batch-1-done"]
