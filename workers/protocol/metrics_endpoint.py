"""The ``/metrics`` endpoint the batcher and each worker serve their registry on."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


def serve_metrics(registry: CollectorRegistry, port: int, host: str) -> None:
    """Serves ``registry`` on ``http://host:port/metrics`` from a daemon thread."""
    start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)
