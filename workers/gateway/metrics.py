"""The gateway's own metrics, on ``GET /metrics``: requests by endpoint (the route's
template, so ids make no new series), method and status, and how long each took to its last
byte (a stream: to its end)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """The series, in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("endpoint", "method", "status")
        self.requests = Counter(
            "batchfleet_gateway_requests",
            "HTTP requests the gateway answered",
            labels,
            registry=self.registry,
        )
        self.latency = Histogram(
            "batchfleet_gateway_request_seconds",
            "Time from a request's arrival to its answer's last byte",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )


class MeasureRequests:
    """An ASGI middleware that counts and times every HTTP request into ``metrics``."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", "other")
            labels = (endpoint, scope["method"], str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - started)
