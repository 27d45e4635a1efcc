"""``deploy/k8s``, validated with no cluster: each overlay built by ``kubectl kustomize``, the
core kinds against Kubernetes' own schemas (``kubernetes-validate``), KEDA's kinds against the
schemas of KEDA's CRDs (vendored in ``keda-2.20.2/``), and what the fleet relies on from them."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from config.keys import CONSUMER_GROUP, Keys
from config.settings import Settings, environment_names
from workers.cli.main import GATEWAY_GRACE_S

ROOT = Path(__file__).parents[2]
OVERLAYS = ("cpu", "gpu", "gpu-sentinel")
KUBERNETES_VERSION = "1.32.0"
KEDA_CRDS = Path(__file__).parent / "keda-2.20.2"
# The trigger metadata KEDA 2.20.2's Redis streams scalers read (pkg/scalers/
# redis_streams_scaler.go and redis_scaler.go): a misspelled key would be ignored by KEDA.
REDIS_STREAMS_METADATA = {
    "address", "addresses", "host", "hosts", "port", "ports", "username", "password",
    "sentinelUsername", "sentinelPassword", "sentinelMaster", "stream", "consumerGroup",
    "pendingEntriesCount", "streamLength", "lagCount", "activationLagCount", "databaseIndex",
    "enableTLS", "unsafeSsl",
}  # fmt: skip
REDIS_STREAMS_TRIGGERS = {"redis-streams", "redis-sentinel-streams"}


def unavailable(message: str) -> None:
    """Skips on a laptop; fails in CI, so that the manifests never go unchecked there."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@functools.cache
def built(overlay: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize`` builds from ``deploy/k8s/overlays/OVERLAY``."""
    return built_from(ROOT / "deploy" / "k8s" / "overlays" / overlay)


def built_from(folder: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize`` builds from the kustomization in ``folder``."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        unavailable("kubectl is not installed (it builds the kustomize overlays)")
    done = subprocess.run(
        [str(kubectl), "kustomize", str(folder)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, deployment in of_kind(objects, "Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            yield name, container


@functools.cache
def keda_schema(kind: str) -> dict[str, Any]:
    """The schema of KEDA's ``kind``, refusing fields it does not define (as a typo would be
    dropped by the API server)."""
    files = {"ScaledObject": "keda.sh_scaledobjects.yaml"}
    files["TriggerAuthentication"] = "keda.sh_triggerauthentications.yaml"
    crd = yaml.safe_load((KEDA_CRDS / files[kind]).read_text())
    (version,) = (v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema: dict[str, Any] = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    return schema


def strict(schema: Any) -> Any:
    """``schema`` with every object that lists its properties closed to others, unless it
    keeps unknown fields (``x-kubernetes-preserve-unknown-fields``)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields")
    if closed and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    return {key: strict(value) for key, value in schema.items()}


def validate(objects: list[dict[str, Any]]) -> None:
    """Each object against its kind's schema: Kubernetes' own, or KEDA's CRDs'."""
    for obj in objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(obj, keda_schema(obj["kind"]))
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def toml_settings(objects: list[dict[str, Any]]) -> Settings:
    """The settings the ConfigMap's batchfleet.toml gives every process."""
    config = of_kind(objects, "ConfigMap")["batchfleet-config"]["data"]["batchfleet.toml"]
    return Settings(**tomllib.loads(config))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_for_kubernetes_and_keda(overlay: str) -> None:
    objects = built(overlay)
    validate(objects)
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "PodDisruptionBudget", "ScaledObject", "TriggerAuthentication"} <= kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_scale_on_each_models_stream_for_the_batchers_group(overlay: str) -> None:
    objects = built(overlay)
    keys = Keys(toml_settings(objects).key_prefix)
    (scaled,) = of_kind(objects, "ScaledObject").values()
    assert scaled["spec"]["scaleTargetRef"]["name"] == "batchfleet-worker"
    assert scaled["spec"]["minReplicaCount"] == 0  # scale to zero, documented
    streams = set()
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] in REDIS_STREAMS_TRIGGERS
        assert set(trigger["metadata"]) <= REDIS_STREAMS_METADATA
        assert trigger["metadata"]["consumerGroup"] == CONSUMER_GROUP
        streams.add(trigger["metadata"]["stream"])
    assert streams == {keys.stream(model) for model in toml_settings(objects).models}
    assert {"lagCount", "pendingEntriesCount"} <= {
        name for trigger in scaled["spec"]["triggers"] for name in trigger["metadata"]
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_stop_gracefully_and_are_probed_and_scraped(overlay: str) -> None:
    """A worker's grace period outlasts a batch's hard time limit; every batchfleet process
    serves its probes and metrics on the port its annotations name; each batcher is named
    after its pod; a disruption budget covers batchers, workers and gateways; every
    BATCHFLEET_ variable is a real setting."""
    objects = built(overlay)
    settings = toml_settings(objects)
    deployments = of_kind(objects, "Deployment")
    worker = deployments["batchfleet-worker"]["spec"]["template"]
    assert worker["spec"]["terminationGracePeriodSeconds"] > settings.worker.time_limit_s
    for name in ("batchfleet-batcher", "batchfleet-worker"):
        template = deployments[name]["spec"]["template"]
        (container,) = template["spec"]["containers"]
        port = container["args"][container["args"].index("--metrics-port") + 1]
        assert template["metadata"]["annotations"]["prometheus.io/port"] == port
        assert [p["containerPort"] for p in container["ports"]] == [int(port)]
        assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    batcher = deployments["batchfleet-batcher"]["spec"]
    (container,) = batcher["template"]["spec"]["containers"]
    assert batcher["replicas"] == 2
    assert container["args"][container["args"].index("--name") + 1] == "$(POD_NAME)"
    pod_name = next(env for env in container["env"] if env["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    budgets = of_kind(objects, "PodDisruptionBudget").values()
    covered = {
        budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] for budget in budgets
    }
    assert covered == {"batchfleet-batcher", "batchfleet-worker", "batchfleet-gateway"}
    known = set(environment_names())
    for _, container in containers(objects):
        for env in container.get("env", []):
            assert not env["name"].startswith("BATCHFLEET_") or env["name"] in known, env


def gateway_container(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway's pod spec and its one container."""
    spec = of_kind(objects, "Deployment")["batchfleet-gateway"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {env["name"]: env for env in container["env"]}


def mount_of(spec: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume ``container`` mounts at ``path``."""
    (mount,) = (m for m in container["volumeMounts"] if m["mountPath"] == path)
    (volume,) = (v for v in spec["volumes"] if v["name"] == mount["name"])
    return volume


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateways_read_their_keys_from_a_secret_and_drain_before_stopping(overlay: str) -> None:
    """The gateway listens where its Service, probes and scrape annotations point, reads its
    keys from a file mounted from the Secret batchfleet-gateway (never from a plain variable),
    is probed on /livez (Redis away gives 503s, not a restart), and its grace period covers
    the preStop pause and the 30 s it gives running calls."""
    objects = built(overlay)
    spec, container = gateway_container(objects)
    args = container["args"]
    port = int(args[args.index("--port") + 1])
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [port]
    template = of_kind(objects, "Deployment")["batchfleet-gateway"]["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    (service_port,) = of_kind(objects, "Service")["batchfleet-gateway"]["spec"]["ports"]
    assert service_port["targetPort"] == container["ports"][0]["name"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/livez"
    keys_file = Path(env_of(container)["BATCHFLEET_GATEWAY__API_KEYS_FILE"]["value"])
    volume = mount_of(spec, container, str(keys_file.parent))
    assert volume["secret"]["secretName"] == "batchfleet-gateway"
    assert "BATCHFLEET_GATEWAY__API_KEYS" not in env_of(container)
    pause_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > pause_s + GATEWAY_GRACE_S
    assert "BATCHFLEET_GATEWAY__FILES_DIR" not in env_of(container)  # the Batch API is off


def test_the_gateway_files_component_gives_every_gateway_one_shared_folder(
    tmp_path: Path,
) -> None:
    """An overlay with components/gateway-files: the Batch API's folder is a volume every
    gateway replica mounts (ReadWriteMany), writable by the image's user."""
    k8s = ROOT / "deploy" / "k8s"
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(k8s / "overlays" / "gpu", tmp_path)],
        "components": [os.path.relpath(k8s / "components" / "gateway-files", tmp_path)],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    objects = built_from(tmp_path)
    validate(objects)
    spec, container = gateway_container(objects)
    files_dir = env_of(container)["BATCHFLEET_GATEWAY__FILES_DIR"]["value"]
    claim = mount_of(spec, container, files_dir)["persistentVolumeClaim"]["claimName"]
    volume_claim = of_kind(objects, "PersistentVolumeClaim")[claim]
    assert volume_claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"]


def test_a_gpu_worker_pod_gets_one_gpu_and_pins_its_process_to_it() -> None:
    for overlay in ("gpu", "gpu-sentinel"):
        worker = of_kind(built(overlay), "Deployment")["batchfleet-worker"]
        (container,) = worker["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["args"][:3] == ["worker", "--gpu", "0"]
    worker = of_kind(built("cpu"), "Deployment")["batchfleet-worker"]
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert container["args"][:2] == ["worker", "--cpu"]
