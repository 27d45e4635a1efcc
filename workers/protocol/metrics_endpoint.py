"""The HTTP endpoint the batcher and each worker serve: ``/metrics`` (their registry),
``/livez`` and ``/readyz`` (their loops' ``Health``: 200 when all are, else 503)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from workers.protocol.health import Health

log = logging.getLogger(__name__)

LIVE_PATH = "/livez"
READY_PATH = "/readyz"


class ThreadingServer(ThreadingMixIn, WSGIServer):
    """Answers each request on a thread of its own: a slow scrape never holds a probe."""

    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    """Logs nothing per request (probes come every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def health_app(
    metrics: Callable[..., Iterable[bytes]], health: Sequence[Health]
) -> Callable[..., Iterable[bytes]]:
    """A WSGI app answering ``/livez`` and ``/readyz`` from ``health``, anything else from
    ``metrics``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in (LIVE_PATH, READY_PATH):
            return metrics(environ, start_response)
        ok = all(loop.live() if path == LIVE_PATH else loop.ready() for loop in health)
        start_response(
            "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")]
        )
        return [b"ok\n" if ok else b"not ok\n"]

    return app


def serve_metrics(
    registry: CollectorRegistry, port: int, host: str, health: Sequence[Health] = ()
) -> None:
    """Serves ``registry`` on ``http://host:port/metrics``, and ``health`` on ``/livez`` and
    ``/readyz``, from a daemon thread."""
    app = health_app(make_wsgi_app(registry), health)
    server = make_server(host, port, app, ThreadingServer, handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-endpoint", daemon=True).start()
    log.info(
        "metrics on http://%s:%d/metrics, probes on %s and %s", host, port, LIVE_PATH, READY_PATH
    )
