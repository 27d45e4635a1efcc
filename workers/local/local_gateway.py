"""A ``batchfleet gateway`` process on this machine, for the tests and the benchmarks."""

from __future__ import annotations

import time

import httpx

from config.errors import BrokerUnavailable
from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import free_port

READY_TIMEOUT_S = 60.0
RETRY_PAUSE_S = 0.1


def start_gateway(processes: LocalFleet) -> str:
    """Starts ``batchfleet gateway`` on a free loopback port among ``processes`` (with their
    environment, which must name an API key) and returns its URL once it answers /healthz
    (200, or 503 while its Redis is away).

    Raises:
        BrokerUnavailable: it exited, or did not answer within a minute (its log attached).
    """
    port = free_port()
    process = processes.start("gateway", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code in (200, 503):
                return url
        except httpx.TransportError:
            time.sleep(RETRY_PAUSE_S)  # not listening yet
    raise BrokerUnavailable(f"the gateway did not come up on {url}\n{processes.logs()}")
