"""The ``batchfleet`` command as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import redis

from config.errors import RedisAccessDenied
from config.settings import load_settings
from producer.client import Producer
from workers.local.local_redis import LocalRedis
from workers.runtime.gpu import gpu_count


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("BATCHFLEET_")}
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def row(line: str) -> dict[str, str]:
    """The columns of a report row after its 'done' column."""
    tokens = line.split()
    done = next(index for index, token in enumerate(tokens) if re.fullmatch(r"\d+/\d+", token))
    names = ["done", "errors", "req/s", "p50", "p95", "p99", "overhead p99", "batch", "busy"]
    return dict(zip(names, tokens[done:], strict=True))


@pytest.mark.slow
def test_demo_runs_a_private_fleet_and_reports() -> None:
    """The demo needs nothing but the install: it completes every request and beats one-by-one."""
    done = run_cli("demo", "--requests", "400", "--baseline", "100")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    batched = row(next(line for line in lines if line.startswith("batched")))
    single = row(next(line for line in lines if line.startswith("one at a time")))
    assert batched["done"] == "400/400" and single["done"] == "100/100"
    assert batched["errors"] == single["errors"] == "0"
    assert float(batched["batch"]) > 1, "mean batch size should be well above 1"
    batched_rps, single_rps = float(batched["req/s"]), float(single["req/s"])
    assert batched_rps > single_rps


def test_invalid_settings_fail_with_one_clear_line() -> None:
    """A bad setting stops the worker with one line naming the problem, not a traceback."""
    done = run_cli("worker", "--cpu", env={"BATCHFLEET_WORKER__TIME_LIMIT_S": "100"}, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("batchfleet: error: invalid settings")
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_unknown_backend_fails_with_one_clear_line(redis_server: LocalRedis) -> None:
    """A model whose backend cannot be loaded stops the worker with one clear line."""
    done = run_cli(
        "worker",
        "--cpu",
        env={
            "BATCHFLEET_REDIS_URL": redis_server.url,
            "BATCHFLEET_MODELS__SYNTHETIC__BACKEND": "nowhere.module:Model",
        },
        timeout=60,
    )
    assert done.returncode == 2
    assert "cannot load backend 'nowhere.module:Model'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_wrong_redis_password_says_authentication_failed_not_unavailable() -> None:
    """Refused credentials are RedisAccessDenied at the producer and one clear line (exit 2)
    from the batcher, not BrokerUnavailable, which would have people wait for an outage."""
    with LocalRedis() as server:
        with redis.Redis.from_url(server.url) as admin:
            admin.config_set("requirepass", "right-password")
        wrong = server.url.replace("redis://", "redis://:wrong-password@")
        settings = load_settings(redis_url=wrong)
        with Producer(settings) as producer, pytest.raises(RedisAccessDenied) as refused:
            producer.submit("synthetic", "x")
        done = run_cli("batcher", env={"BATCHFLEET_REDIS_URL": wrong}, timeout=60)
    assert "Redis authentication failed" in str(refused.value)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("batchfleet: error: Redis authentication failed")
    )
    assert "wrong-password" not in done.stderr + str(refused.value)


def test_a_gpu_the_machine_does_not_have_is_refused(redis_server: LocalRedis) -> None:
    """``worker --gpu N`` past the GPUs NVML finds (any N on a machine without one) stops
    with one clear line, instead of joining the fleet on the CPU as if pinned."""
    missing = gpu_count()
    done = run_cli(
        "worker", "--gpu", str(missing), env={"BATCHFLEET_REDIS_URL": redis_server.url}, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"batchfleet: error: --gpu {missing}: ")
    assert "loaded" not in done.stderr


def test_the_demo_on_your_redis_says_so_and_leaves_only_your_keys() -> None:
    """With BATCHFLEET_REDIS_URL set, the demo names that Redis (not "a private Redis") and
    deletes every key it made there, Celery's transport keys included."""
    with LocalRedis() as server, redis.Redis.from_url(server.url) as client:
        client.set("yours", "kept")
        done = run_cli(
            "demo", "--requests", "50", "--baseline", "10", env={"BATCHFLEET_REDIS_URL": server.url}
        )
        left = sorted(key.decode() for key in client.keys("*"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "the Redis of BATCHFLEET_REDIS_URL" in done.stdout and "a private Redis" not in done.stdout
    )
    assert left == ["yours"]
