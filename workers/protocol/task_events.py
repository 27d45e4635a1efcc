"""A worker's task events, published together on a timer instead of one publish each.

Flower shows each batch from the worker's task events (received, started, succeeded). Celery
buffers them, but asks its event loop to publish the buffer on its next turn after every
event: two or three Redis round trips per batch on the thread that also takes the next
batch from the broker. ``FlushTaskEvents`` publishes the buffer every ``EVENT_FLUSH_S``
instead (and, as Celery does, at once when ``buffer_limit`` events wait), and once more when
the consumer stops, so that no event is left behind.

Celery 5.6 loses an event that a pool thread buffers while the loop publishes the buffer: its
flush publishes the buffer's list, then empties it, appended event and all (celery#10434,
fixed in 5.7, which the fleet cannot take yet: see ``pyproject.toml``). ``WorkerEvents`` gives
the worker ``TaskEventDispatcher``, whose flush empties only what it published.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps
from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher

# How long an event may wait for company: Flower shows a batch this much later, at most.
EVENT_FLUSH_S = 0.1


class TaskEventDispatcher(EventDispatcher):  # type: ignore[misc]  # Celery has no types
    """Celery's dispatcher, with the buffered-event flush of celery#10435."""

    def flush(self, errors: bool = True, groups: bool = True) -> None:
        super().flush(errors=errors, groups=False)
        if not groups:
            return
        with self.mutex:
            for group, events in list(self._group_buffer.items()):
                if events:
                    # A copy: another thread may append while this one writes to Redis, and
                    # a publish that fails keeps what it was given for the next flush.
                    published = list(events)
                    self._publish(published, self.producer, f"{group}.multi")
                    del events[: len(published)]


class WorkerEvents(Events):  # type: ignore[misc]  # Celery has no types
    """The app's events (``Celery(events=...)``), sent through ``TaskEventDispatcher``."""

    dispatcher_cls = TaskEventDispatcher


class FlushTaskEvents(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery has no types
    """A consumer bootstep (``app.steps["consumer"]``) after Celery's ``Events``."""

    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._timer: Any = None
        # Set by the thread that buffers an event (the loop's, or a pool thread's), cleared
        # by the loop's timer: one that races a flush only makes the next tick flush too.
        self._buffered = False

    def start(self, parent: Any) -> None:
        dispatcher = parent.event_dispatcher
        if parent.hub is None or dispatcher is None:  # no event loop: Celery sends each
            return
        dispatcher.on_send_buffered = self._note_buffered
        self._timer = parent.hub.call_repeatedly(EVENT_FLUSH_S, self._flush, parent)

    def stop(self, parent: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._flush(parent)  # an event that fails to publish is kept for the next start

    shutdown = stop

    def _note_buffered(self) -> None:
        self._buffered = True

    def _flush(self, parent: Any) -> None:
        """Publishes the buffered events, if any (an empty flush would publish an empty
        list)."""
        if self._buffered:
            self._buffered = False
            parent._flush_events()
