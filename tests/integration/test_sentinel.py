"""The fleet on a Redis Sentinel group, named by one setting: producers, a batcher, a worker,
the Celery broker (kombu's Sentinel transport) and Flower all reach the master through the
sentinels."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from workers.local.local_fleet import LocalFleet
from workers.local.sentinel_group import NAME, SentinelGroup

from .test_flower import AUTH, serve_and_show_in_flower
from .test_security import make_certificates, tls_redis_binary

SENTINEL_PASSWORD = "sentinel-" + uuid.uuid4().hex[:8]

pytestmark = pytest.mark.sentinel


@contextmanager
def fleet_on(group: SentinelGroup, **settings: str) -> Iterator[LocalFleet]:
    """A fleet whose Redis settings are the Sentinel group's URL and master name, and
    ``settings`` (``BATCHFLEET_`` names)."""
    with group:
        fleet = LocalFleet(
            {
                "BATCHFLEET_REDIS_URL": group.url,
                "BATCHFLEET_REDIS_SENTINEL_MASTER": NAME,
                "BATCHFLEET_KEY_PREFIX": f"t{uuid.uuid4().hex[:10]}",
                "FLOWER_BASIC_AUTH": ":".join(AUTH),
                **settings,
            }
        )
        try:
            yield fleet
        finally:
            fleet.close()


@pytest.fixture
def sentinel_fleet() -> Iterator[LocalFleet]:
    """A fleet whose only Redis setting is a Sentinel group's URL and master name."""
    with fleet_on(SentinelGroup()) as fleet:
        yield fleet


@pytest.fixture
def tls_sentinel_fleet(tmp_path: Path) -> Iterator[LocalFleet]:
    """A fleet on a Sentinel group reached over TLS only (certificates verified), whose
    sentinels require a password."""
    certs = make_certificates(tmp_path)
    group = SentinelGroup(password=SENTINEL_PASSWORD, tls=certs, binary=tls_redis_binary(certs))
    tls = {
        "BATCHFLEET_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
        "BATCHFLEET_REDIS_SENTINEL_TLS_CA": str(certs / "ca.pem"),
    }
    with fleet_on(group, **tls) as fleet:
        yield fleet


def test_every_process_reaches_the_master_through_the_sentinels(
    sentinel_fleet: LocalFleet,
) -> None:
    """Requests are answered in batches, and Flower shows the batch tasks and the worker."""
    serve_and_show_in_flower(sentinel_fleet, "w1@sentinel")


@pytest.mark.tls
def test_every_process_reaches_sentinels_that_want_tls_and_a_password(
    tls_sentinel_fleet: LocalFleet,
) -> None:
    """The same over TLS to the sentinels and the master, with the sentinels' password;
    nothing reaches them in the clear (their URL names TLS ports only)."""
    serve_and_show_in_flower(tls_sentinel_fleet, "w1@sentinel")
    assert SENTINEL_PASSWORD not in tls_sentinel_fleet.logs()
