"""Builds the Celery app from settings: JSON only, late acks, one reserved batch per slot, on
the fleet's Redis or a broker of its own (another Redis, or RabbitMQ)."""

from __future__ import annotations

from urllib.parse import urlsplit

from celery import Celery

from config.keys import Keys
from config.sentinel import broker_tls, sentinel_options
from config.settings import SENTINEL_SCHEME, Settings
from workers.protocol.broker_transport import REDIS_SCHEMES, kombu_url, register_transport
from workers.protocol.task_events import FlushTaskEvents, WorkerEvents


def broker_url(settings: Settings) -> str:
    """The URL of the Celery broker: ``broker_url``, else the fleet's Redis, as kombu names
    it (``kombu_url``)."""
    return kombu_url((settings.broker_url or settings.redis_url).get_secret_value())


def make_celery_app(settings: Settings) -> Celery:
    """A Celery app on the fleet's Redis, configured for at-least-once batches.

    The stream ledger, not Celery, is the source of truth: a batch Celery drops is reclaimed
    from the stream after ``batcher.reclaim_lease_s``. The time limits are ordered so that a
    running batch is never reclaimed while it can still finish.

    On a Redis broker, kombu's ack emulation is off: it copied every delivered batch into an
    ``unacked`` hash and deleted it at the ack, two transactions a batch (~15% of a busy
    worker's CPU), to deliver again after a visibility timeout what the request stream's lease
    reclaims anyway. A worker still acks late in its own memory: a batch it rejects, or holds
    unacked when it stops, goes back to the queue marked redelivered.
    """
    register_transport()
    keys = Keys(settings.key_prefix)
    worker = settings.worker
    url = broker_url(settings)
    scheme = urlsplit(url).scheme
    transport_options: dict[str, object] = {}
    if scheme in REDIS_SCHEMES:
        transport_options = {
            "ack_emulation": False,
            "socket_timeout": settings.redis_socket_timeout_s,
            "socket_connect_timeout": settings.redis_socket_timeout_s,
            "socket_keepalive": True,
            "health_check_interval": 10,
        }
    if scheme == SENTINEL_SCHEME:
        transport_options["master_name"] = settings.redis_sentinel_master
        transport_options["sentinel_kwargs"] = sentinel_options(settings)
    app = Celery("batchfleet", broker=url, set_as_current=False, events=WorkerEvents)
    app.steps["consumer"].add(FlushTaskEvents)
    if scheme == SENTINEL_SCHEME and settings.redis_sentinel_tls_ca is not None:
        app.conf.broker_use_ssl = broker_tls(settings)
    app.conf.update(
        accept_content=["json"],
        result_accept_content=["json"],
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=worker.soft_time_limit_s,
        task_time_limit=worker.time_limit_s,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # A running batch can only be cancelled in a prefork child; asked to in the threads
        # or solo pool, Celery 5.6 ends the worker instead. There the batch runs on, its answers
        # are written once, and Celery's redelivery finds them already written.
        worker_cancel_long_running_tasks_on_connection_loss=worker.pool == "prefork",
        # Flower shows each batch from the worker's received, started and succeeded events,
        # published together every 0.1 s (FlushTaskEvents); a sent event from the batcher
        # would cost every batch one more publish.
        worker_send_task_events=True,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
        task_default_queue=keys.celery_queue(next(iter(settings.models))),
        # Events and remote control under the fleet's prefix, as its queues are: fleets that
        # share a Redis neither see each other's workers nor leave bindings in common keys.
        event_exchange=f"{settings.key_prefix}.celeryev",
        control_exchange=settings.key_prefix,
        task_create_missing_queues=True,
        task_create_missing_queue_type=settings.broker_queue_type,
    )
    return app
