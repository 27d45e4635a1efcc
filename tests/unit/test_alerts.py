"""A worker's own alerts, and the Prometheus rules that encode the same conditions."""

from __future__ import annotations

import re
from pathlib import Path

import fakeredis
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from config.keys import Keys
from config.schema import Request
from config.settings import AlertSettings
from workers.batcher.metrics import batcher_registry
from workers.runtime.alerts import WorkerAlerts
from workers.runtime.gpu import GpuReading, GpuTelemetry
from workers.runtime.metrics import WorkerMetrics

RULES = Path(__file__).parents[2] / "config" / "prometheus" / "alerts.yml"
QUEUED = {"synthetic": 12}


def gpu(utilisation: float = 0.9, temperature_c: float = 60.0) -> GpuReading:
    return GpuReading(0, "H200", utilisation, 2**30, 2**34, temperature_c, 300.0)


@pytest.fixture
def alerts() -> WorkerAlerts:
    return WorkerAlerts(AlertSettings(), "gpu0@h", started_at=0.0)


def test_an_idle_gpu_while_requests_wait_is_warned_once_after_a_minute(
    alerts: WorkerAlerts, caplog: pytest.LogCaptureFixture
) -> None:
    assert alerts.check(10.0, gpu(utilisation=0.2), QUEUED, last_batch_at=9.0) == []
    assert alerts.check(69.0, gpu(utilisation=0.2), QUEUED, last_batch_at=68.0) == []
    assert alerts.check(70.0, gpu(utilisation=0.2), QUEUED, last_batch_at=69.0) == ["gpu_underused"]
    assert alerts.check(90.0, gpu(utilisation=0.2), QUEUED, last_batch_at=89.0) == []
    assert "GPU utilisation 20% (under 50%) while requests wait" in caplog.text


def test_an_alert_that_cleared_is_warned_again_when_it_returns(alerts: WorkerAlerts) -> None:
    alerts.check(0.0, gpu(temperature_c=90), {}, None)
    assert alerts.check(60.0, gpu(temperature_c=90), {}, None) == ["gpu_hot"]
    alerts.check(61.0, gpu(temperature_c=70), {}, None)
    alerts.check(62.0, gpu(temperature_c=91), {}, None)
    assert alerts.check(122.0, gpu(temperature_c=91), {}, None) == ["gpu_hot"]


def test_an_idle_gpu_with_nothing_queued_is_no_alert(alerts: WorkerAlerts) -> None:
    for now in (0.0, 100.0, 200.0):
        assert alerts.check(now, gpu(utilisation=0.0), {"synthetic": 0}, last_batch_at=None) == []


def test_a_worker_that_finishes_nothing_while_requests_wait_is_stuck(alerts: WorkerAlerts) -> None:
    """No batch for stuck_s (120 s) with requests waiting; on the CPU, with no GPU reading."""
    assert alerts.check(100.0, None, QUEUED, last_batch_at=0.0) == []
    assert alerts.check(121.0, None, QUEUED, last_batch_at=0.0) == ["stuck"]
    assert alerts.check(125.0, None, QUEUED, last_batch_at=124.0) == []


def test_a_deep_queue_is_warned_after_a_minute(alerts: WorkerAlerts) -> None:
    deep = {"synthetic": 10_001}
    assert alerts.check(0.0, None, deep, last_batch_at=0.0) == []
    assert alerts.check(60.0, None, deep, last_batch_at=60.0) == ["queue_deep"]


def served_metric_names() -> set[str]:
    """Every sample name the batcher and a worker with a GPU serve."""
    client = fakeredis.FakeRedis()
    counts = {"accepted": 4, "completed": 2, "failed:expired": 1, "refused:queue_full": 1}
    client.hset(Keys().stats("synthetic"), mapping={**counts, "batches:size": 1})
    telemetry = GpuTelemetry(0)
    telemetry.latest = gpu()
    worker = WorkerMetrics(telemetry, "gpu0@h")
    request = Request(
        request_id="r1", model="synthetic", input="a", digest="d", submitted_at=1, deadline_at=9
    )
    worker.observe_run("synthetic", [request], model_s=0.1, finished_at=2.0)
    texts = [
        generate_latest(registry).decode()
        for registry in (batcher_registry(client, Keys(), ["synthetic"]), worker.registry)
    ]
    return {
        sample.name
        for text in texts
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_alert_rules_are_complete_and_read_only_metrics_the_fleet_serves() -> None:
    """Each rule names its alert, severity and summary; every metric an expression reads is
    one the fleet serves; the thresholds are the worker's defaults."""
    (group,) = yaml.safe_load(RULES.read_text())["groups"]
    rules = {rule["alert"]: rule for rule in group["rules"]}
    assert set(rules) == {
        "BatchfleetGpuUnderused",
        "BatchfleetGpuHot",
        "BatchfleetQueueDeep",
        "BatchfleetWorkerStuck",
    }
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s"))
    served = served_metric_names()
    read = {name for rule in rules.values() for name in re.findall(r"batchfleet_\w+", rule["expr"])}
    assert read <= served, f"rules read metrics nobody serves: {read - served}"
    defaults = AlertSettings()
    assert f"< {defaults.low_utilisation}" in rules["BatchfleetGpuUnderused"]["expr"]
    assert f"> {defaults.temperature_c:g}" in rules["BatchfleetGpuHot"]["expr"]
    assert f"> {defaults.queue_depth}" in rules["BatchfleetQueueDeep"]["expr"]
    assert f"[{defaults.stuck_s / 60:g}m]" in rules["BatchfleetWorkerStuck"]["expr"]
    assert rules["BatchfleetGpuHot"]["for"] == f"{defaults.for_s / 60:g}m"
