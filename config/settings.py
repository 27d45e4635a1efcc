"""Typed settings: environment (``BATCHFLEET_…``), an optional TOML file, and per-model policy.

Load them once at an entry point with :func:`load_settings` and pass the object down.
Precedence: explicit arguments, then environment variables, then the TOML file named by
``BATCHFLEET_CONFIG``, then the defaults below. Nested fields use ``__`` in the environment,
e.g. ``BATCHFLEET_WORKER__CONCURRENCY=2``; ``BATCHFLEET_MODELS`` takes JSON.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from config.errors import ConfigError

MIB = 1024 * 1024
ENV_PREFIX = "BATCHFLEET_"
SENTINEL_SCHEME = "sentinel"
# redis-py's scheme for a Redis on a Unix socket.
UNIX_SCHEME = "unix"
# A worker counts as alive for this many heartbeats after its last one.
HEARTBEAT_TTL_BEATS = 3
CONFIG_FILE_ENV = "BATCHFLEET_CONFIG"
# Worker settings of earlier releases that no longer do anything: accepted with a warning, so
# that an upgrade does not stop a fleet whose configuration still sets them.
RETIRED_WORKER_SETTINGS = {
    "visibility_timeout_s": "Celery no longer delivers a batch again on a Redis broker; a batch"
    " it drops is reclaimed from the request stream after batcher.reclaim_lease_s",
}

log = logging.getLogger(__name__)


class ModelPolicy(BaseModel):
    """How one model is served: its backend and its batching and queueing limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = "synthetic"
    max_batch_size: int = Field(32, ge=1, le=4096)
    max_wait_s: float = Field(0.015, ge=0)
    # A batch waiting for its device tops itself up with newer requests when the device frees.
    # Off, batches close in the batcher: at max_batch_size, or when the oldest waited max_wait_s.
    late_binding: bool = True
    # With a model that reports each input's cost (e.g. its tokens): a batch pays for its
    # longest input times its size, and the batcher keeps it under max_batch_cost and/or
    # fills it with inputs of similar cost (group_by_cost). Either turns late binding off:
    # only the batcher, which sees the costs, forms batches.
    max_batch_cost: int | None = Field(None, ge=1)
    group_by_cost: bool = False
    # Requests may carry a priority (high, normal, low): the batcher fills batches from a
    # pool of queued requests in order of due time, a request's deadline plus 0, 1 or 2 x
    # priority_aging_s, so a lower priority waits longer but is never starved.
    priorities: bool = False
    priority_aging_s: float = Field(10.0, gt=0)
    # A batch held to grow is sent early when holding it longer, plus the model time
    # measured for its size, would make its earliest deadline pass.
    deadline_aware: bool = True
    max_queue_len: int = Field(100_000, ge=1)
    max_input_bytes: int = Field(MIB, ge=1)
    request_timeout_s: float = Field(60.0, gt=0)
    result_ttl_s: float = Field(3600.0, gt=0)
    # A response cache: an input answered before by this version of the model is answered
    # again at submit, for this long after it was computed; None: no cache.
    cache_ttl_s: float | None = Field(None, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def uses_costs(self) -> bool:
        """Whether batches are formed by their inputs' costs."""
        return self.max_batch_cost is not None or self.group_by_cost

    @property
    def batcher_chooses(self) -> bool:
        """Whether the batcher forms each batch from a pool of queued requests (by cost or by
        priority), instead of sending what comes for workers to top up."""
        return self.uses_costs or self.priorities

    @property
    def tops_up(self) -> bool:
        """Whether a batch waiting for its device takes newer requests (late binding)."""
        return self.late_binding and not self.batcher_chooses


class BatcherSettings(BaseModel):
    """The batcher's recovery knobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reclaim_lease_s: float = Field(55.0, gt=0)
    batches_per_worker_slot: int = Field(1, ge=1)
    # A request whose process died this many times while running it (a segfault, OOM, CUDA
    # abort on that input) is answered poison and moved to the dead-letter stream instead of
    # being sent again.
    max_attempts: int = Field(2, ge=2)

    @property
    def reclaim_scan_s(self) -> float:
        """How often a batcher (and a streaming lane) looks for leases that ran out."""
        return self.reclaim_lease_s / 4


class WorkerSettings(BaseModel):
    """The Celery worker's execution and liveness knobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pool: Literal["threads", "solo", "prefork"] = "threads"
    concurrency: int = Field(2, ge=1)
    soft_time_limit_s: float = Field(10.0, gt=0)
    time_limit_s: float = Field(15.0, gt=0)
    heartbeat_s: float = Field(1.0, gt=0)
    # A batch of more than one input starts only with this much GPU memory free (NVML's view,
    # read every heartbeat); below it, the batch runs in halves. 0: no gate. NVML counts
    # memory a framework keeps cached (PyTorch's allocator) as used: set it for GPUs shared
    # with other processes, above the model's own peak.
    gpu_min_free_mb: int = Field(0, ge=0)
    # Streaming requests a worker runs at once per model, each on its own, beside its batches.
    stream_concurrency: int = Field(16, ge=1)
    # Worker processes on each GPU: ``--gpus all`` starts this many per GPU, and as many
    # ``--gpu auto`` replicas share each GPU. Above 1 for a model that launches its batch from
    # Python (eager PyTorch), which its process's interpreter bounds, not its GPU.
    processes_per_gpu: int = Field(1, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _drop_retired(cls, values: Any) -> Any:
        """Drops the settings of ``RETIRED_WORKER_SETTINGS``, warning for each one set."""
        if not isinstance(values, dict):
            return values
        for name in RETIRED_WORKER_SETTINGS.keys() & values.keys():
            log.warning(
                "worker.%s is set but has no effect: %s", name, RETIRED_WORKER_SETTINGS[name]
            )
        return {
            name: value for name, value in values.items() if name not in RETIRED_WORKER_SETTINGS
        }

    @property
    def heartbeat_ttl_s(self) -> float:
        """How long a worker counts as alive after its last heartbeat."""
        return HEARTBEAT_TTL_BEATS * self.heartbeat_s

    @property
    def slots(self) -> int:
        """How many batches one worker process runs or holds ready at once."""
        return 1 if self.pool == "solo" else self.concurrency

    @property
    def celery_concurrency(self) -> int:
        """Celery's concurrency, and so how many batches a worker process reserves at once:
        one per slot, and in the threads pool one thread more, which writes the answers of a
        batch its device is done with (that batch gave its slot back) while the next batch
        arrives, or takes the full batch a batcher may send beyond the slots."""
        return self.slots + 1 if self.pool == "threads" else self.slots


class AlertSettings(BaseModel):
    """When a worker warns (and ``config/prometheus/alerts.yml`` fires, with the same
    thresholds): a GPU under ``low_utilisation`` while requests wait, a GPU over
    ``temperature_c``, a queue deeper than ``queue_depth`` (each held for ``for_s``), and a
    worker that finished nothing for ``stuck_s`` while requests wait."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    low_utilisation: float = Field(0.5, ge=0, le=1)
    temperature_c: float = Field(85.0, gt=0)
    queue_depth: int = Field(10_000, ge=1)
    for_s: float = Field(60.0, ge=0)
    stuck_s: float = Field(120.0, gt=0)


class GatewaySettings(BaseModel):
    """The HTTP gateway (``batchfleet gateway``): its API keys, given in ``api_keys``
    (comma-separated) or a file of one key or ``sha256:HEX`` digest a line, the size caps of
    a request body and of an uploaded file, and the folder that holds the Batch API's files
    (shared by every gateway of the fleet; without it the Batch API is off)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_keys: SecretStr | None = None
    api_keys_file: Path | None = None
    max_body_bytes: int = Field(4 * MIB, ge=1024)
    files_dir: Path | None = None
    max_file_bytes: int = Field(200 * MIB, ge=1024)
    # A Batch API job's runner renews its lease every third of this; a gateway takes over a
    # job whose lease ran out.
    batch_lease_s: float = Field(30.0, ge=1.0)


def default_models() -> dict[str, ModelPolicy]:
    """With no configuration the fleet serves one synthetic model named ``synthetic``."""
    return {"synthetic": ModelPolicy()}


class Settings(BaseSettings):
    """Everything a batchfleet process needs to know, frozen after load."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    # One Redis (``redis://``, ``rediss://``; ``unix://[:password@]/path/redis.sock?db=0`` for
    # one on this host's Unix socket) or a Sentinel group watching one: kombu's form,
    # ``sentinel://[:password@]host1:26379;sentinel://host2:26379[/db]`` (the password is the
    # master's), with the master's name in ``redis_sentinel_master``.
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    redis_sentinel_master: str | None = None
    # The sentinels' own password, where they require one (``requirepass`` in their config).
    redis_sentinel_password: SecretStr | None = None
    # TLS to the sentinels and to the master they name, its certificate verified against this
    # CA file (PEM); unset, both are plain TCP.
    redis_sentinel_tls_ca: Path | None = None
    # ``redis_url`` names a node of a Redis Cluster: the request path spreads over its masters
    # by model (each model's keys share one hash slot). The batch hop cannot go there
    # (kombu has no cluster transport): ``broker_url`` must name another Redis or RabbitMQ.
    redis_cluster: bool = False
    # Admission and every answer write wait until this many replicas have them (Redis
    # ``WAIT``), so that a failover loses neither; 0 (the default) waits for none.
    redis_wait_replicas: int = Field(0, ge=0)
    redis_wait_timeout_s: float = Field(1.0, gt=0)
    # The Celery broker that carries the batches (the batch hop), when not the Redis above:
    # another Redis (``redis://``, ``rediss://``, ``unix://``) or RabbitMQ (``amqp://``).
    # Redis Cluster cannot carry it (kombu has no cluster transport).
    broker_url: SecretStr | None = None
    # With RabbitMQ: ``quorum`` declares the batch queues as quorum queues, replicated across
    # the RabbitMQ cluster (``classic`` queues live on one node).
    broker_queue_type: Literal["classic", "quorum"] = "classic"
    # Above the 1 s blocking reads of batchers and inbox listeners, which must not time out.
    redis_socket_timeout_s: float = Field(5.0, ge=2.0)
    # Requests ``submit_many`` admits per round trip: the first batch can start while the
    # rest are still being written (also capped by the model's max_queue_len).
    submit_chunk: int = Field(256, ge=1)
    # How long ``submit`` and ``submit_many`` keep trying one admission while Redis cannot be
    # reached (a stall, a restart, a failover) before they raise ``BrokerUnavailable``; 0 fails
    # at the first error. A retried admission never enqueues twice (idempotent by id and input).
    submit_retry_s: float = Field(10.0, ge=0)
    key_prefix: str = Field("bf", pattern=r"^[A-Za-z0-9_.-]+$")
    # Where ``--metrics-port`` serves /metrics: loopback unless told (0.0.0.0 in a container).
    metrics_host: str = "127.0.0.1"
    # The price of one GPU (one worker's device) for an hour: bench, submit and top then
    # report cost per 1,000 requests (per million tokens) and what idle device time cost.
    gpu_cost_per_hour: float | None = Field(None, gt=0)
    models: dict[str, ModelPolicy] = Field(default_factory=default_models)
    batcher: BatcherSettings = Field(default_factory=BatcherSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)

    @model_validator(mode="after")
    def _check_sentinel(self) -> Settings:
        """A Sentinel URL names its master; a master name comes with a Sentinel URL."""
        sentinel = self.redis_url.get_secret_value().startswith(SENTINEL_SCHEME + "://")
        if sentinel and not self.redis_sentinel_master:
            raise ValueError("a sentinel:// redis_url needs redis_sentinel_master (its name)")
        if self.redis_sentinel_master and not sentinel:
            raise ValueError("redis_sentinel_master is set, but redis_url is not sentinel://")
        if self.redis_sentinel_tls_ca is not None and not sentinel:
            raise ValueError("redis_sentinel_tls_ca is set, but redis_url is not sentinel://")
        return self

    @model_validator(mode="after")
    def _check_cluster(self) -> Settings:
        """A cluster carries the request path only, and Sentinel or WAIT do not apply."""
        if not self.redis_cluster:
            return self
        if self.broker_url is None:
            raise ValueError(
                "redis_cluster needs broker_url: Celery's broker cannot run on a Redis Cluster"
                " (give it another Redis or RabbitMQ)"
            )
        if self.redis_sentinel_master:
            raise ValueError("redis_cluster and redis_sentinel_master exclude each other")
        if self.redis_wait_replicas:
            raise ValueError("redis_wait_replicas does not apply to a Redis Cluster")
        if self.redis_url.get_secret_value().startswith(UNIX_SCHEME + "://"):
            raise ValueError("redis_cluster needs a node's host and port, not a unix:// URL")
        return self

    @model_validator(mode="after")
    def _check_time_limits(self) -> Settings:
        """Soft < hard time limit < stream reclaim lease; a batch that waits for every other
        batch its worker reserved still finishes within the lease, and a dead worker looks
        dead before its batch is reclaimed."""
        limits = [
            ("worker.soft_time_limit_s", self.worker.soft_time_limit_s),
            ("worker.time_limit_s", self.worker.time_limit_s),
            ("batcher.reclaim_lease_s", self.batcher.reclaim_lease_s),
        ]
        for (low_name, low), (high_name, high) in itertools.pairwise(limits):
            if not low < high:
                raise ValueError(f"{low_name} ({low}) must be below {high_name} ({high})")
        # A reserved batch may wait for every other reserved batch before its own run, and its
        # requests' lease runs from the batcher's read until the batch starts.
        reserved = self.worker.celery_concurrency
        if not reserved * self.worker.time_limit_s < self.batcher.reclaim_lease_s:
            raise ValueError(
                f"{reserved} reserved batches x worker.time_limit_s ({self.worker.time_limit_s})"
                f" must be below batcher.reclaim_lease_s ({self.batcher.reclaim_lease_s})"
            )
        if not self.worker.heartbeat_ttl_s < self.batcher.reclaim_lease_s:
            raise ValueError(
                f"{HEARTBEAT_TTL_BEATS} x worker.heartbeat_s ({self.worker.heartbeat_s}) must be "
                f"below batcher.reclaim_lease_s ({self.batcher.reclaim_lease_s}): a dead "
                "worker must look dead before its batch is reclaimed"
            )
        if not self.models:
            raise ValueError("models: at least one model must be configured")
        for name in self.models:
            if not name or set(name) & set(":{}") or not name.isprintable():
                raise ValueError(
                    f"models: invalid model name {name!r} (printable, without ':', '{{' or '}}')"
                )
        return self

    def policy(self, model: str) -> ModelPolicy:
        """Returns the policy of ``model``; KeyError when the fleet does not serve it."""
        return self.models[model]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)


def environment_names() -> list[str]:
    """Every variable name the settings read (a model's fields under ``<MODEL>``)."""
    names = [CONFIG_FILE_ENV]
    groups: dict[str, type[BaseModel]] = {
        "models": ModelPolicy,
        "batcher": BatcherSettings,
        "worker": WorkerSettings,
        "alerts": AlertSettings,
        "gateway": GatewaySettings,
    }
    for name in Settings.model_fields:
        names.append(f"{ENV_PREFIX}{name.upper()}")
        group = groups.get(name)
        if group is not None:
            middle = "__<MODEL>" if name == "models" else ""
            names += [
                f"{ENV_PREFIX}{name.upper()}{middle}__{field.upper()}"
                for field in group.model_fields
            ]
    return names


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuses a ``BATCHFLEET_*`` variable that names no setting: a misspelled one would
    otherwise be ignored, and the fleet would run on the default it meant to change.

    Raises:
        ConfigError: naming the variable and the closest valid name.
    """
    names = environment_names()
    top_level = {name for name in names if "__" not in name}
    groups = {name.split("__")[0] for name in names if "__" in name}
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in top_level:
            continue
        if "__" in upper and upper.split("__")[0] in groups:
            continue  # a nested name: its fields are checked with the values
        closest = closest_name(upper, names)
        hint = f"; did you mean {closest}?" if closest else ""
        raise ConfigError(f"{variable} is not a batchfleet setting{hint}")


def closest_name(variable: str, names: list[str]) -> str | None:
    """The valid name nearest ``variable``, compared without the shared prefix, whole or by
    its last part (``BATCHFLEET_MAX_BATCH_SIZE`` → the model field); None if none is near."""
    wanted = variable.removeprefix(ENV_PREFIX)

    def likeness(name: str) -> float:
        rest = name.removeprefix(ENV_PREFIX)
        return max(
            difflib.SequenceMatcher(None, wanted, rest).ratio(),
            difflib.SequenceMatcher(None, wanted, rest.split("__")[-1]).ratio(),
        )

    best = max(names, key=likeness)
    return best if likeness(best) >= 0.6 else None


def load_settings(**overrides: Any) -> Settings:
    """Loads settings from the environment and the optional TOML file.

    Raises:
        ConfigError: the settings are invalid, or a ``BATCHFLEET_*`` variable names no
            setting; the message names each bad field.
    """
    check_environment(os.environ)
    config_file = os.environ.get(CONFIG_FILE_ENV)
    if config_file and not Path(config_file).is_file():
        raise ConfigError(f"{CONFIG_FILE_ENV}={config_file}: no such file")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from exc
    except ValueError as exc:
        raise ConfigError(f"invalid settings: {exc}") from exc
