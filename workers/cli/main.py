"""The ``batchfleet`` command: ``worker``, ``batcher``, ``submit``, ``top``, ``flower``,
``gateway``, ``demo``, ``bench``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from config.errors import BatchfleetError, BrokerUnavailable, ConfigError
from config.settings import Settings, load_settings
from workers.cli.args import (
    non_negative_float,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    rate_list,
    refresh_seconds,
)

log = logging.getLogger("batchfleet")
# On SIGTERM the gateway stops taking calls and gives those it runs this long to finish.
GATEWAY_GRACE_S = 30
# Longer than the idle timeout of common load balancers and clients' pools (60 s), so that
# the gateway never closes a kept-alive connection just as a client sends on it.
GATEWAY_KEEP_ALIVE_S = 75


def _models(settings: Settings, requested: Sequence[str] | None) -> list[str]:
    if not requested:
        return list(settings.models)
    unknown = sorted(set(requested) - set(settings.models))
    if unknown:
        raise ConfigError(f"unknown model(s) {unknown}; configured: {sorted(settings.models)}")
    return list(requested)


def _gpu_choice(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a GPU index or 'auto', not {value!r}") from None


def _check_redis_version(settings: Settings) -> None:
    """Refuses a Redis older than batchfleet supports; one that cannot be reached yet is
    left to the process's own reconnecting."""
    from config.connection import connect, require_supported_redis

    client = connect(settings)
    try:
        log.info("Redis %s", require_supported_redis(client))
    except BrokerUnavailable as exc:
        log.warning("Redis version not checked: %s", exc)
    finally:
        client.close()


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.runtime.process import run_worker, run_worker_per_gpu

    one_process = args.cpu or args.gpu is not None
    if args.name is not None and not one_process:
        raise ConfigError("--name names one process: use it with --gpu N or --cpu")
    if args.core is not None and not one_process:
        raise ConfigError("--core pins one process: use it with --gpu N or --cpu")
    settings = load_settings()
    models = _models(settings, args.model)
    _check_redis_version(settings)
    if one_process:
        return run_worker(
            settings,
            models,
            gpu=args.gpu,
            name=args.name,
            metrics_port=args.metrics_port,
            core=args.core,
        )
    return run_worker_per_gpu(settings, models, metrics_port=args.metrics_port)


def cmd_batcher(args: argparse.Namespace) -> int:
    from workers.batcher.model_batcher import run_batchers

    settings = load_settings()
    models = _models(settings, args.model)
    _check_redis_version(settings)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping the batcher", signum)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    ran = run_batchers(settings, models, stop, name=args.name, metrics_port=args.metrics_port)
    return 0 if ran else 1


def cmd_top(args: argparse.Namespace) -> int:
    from config.connection import broker_errors, connect
    from config.keys import Keys
    from workers.protocol.entries import to_text
    from workers.tools.top import run_top

    settings = load_settings()
    client, keys = connect(settings), Keys(settings.key_prefix)
    try:
        with broker_errors():
            published = client.hkeys(keys.policies())
        served = {to_text(model) for model in published} | set(settings.models)
        models = args.model or sorted(served)
        unknown = sorted(set(models) - served)
        if unknown:
            raise ConfigError(f"unknown model(s) {unknown}; served: {sorted(served)}")
        price = args.gpu_cost_per_hour or settings.gpu_cost_per_hour
        return run_top(client, keys, models, args.refresh, price)
    finally:
        client.close()


def _worker_devices(settings: Settings, workers: set[str]) -> dict[str, str]:
    """The device each of ``workers`` runs on, as its live status says: processes sharing a
    GPU name the same one; a worker whose status expired is its own device, and so is every
    worker when Redis does not answer: the job is done, only its price is rougher."""
    import redis

    from config import node_status
    from config.connection import connect
    from config.keys import Keys
    from workers.tools.top import node_statuses

    client = connect(settings)
    try:
        statuses = node_statuses(client, Keys(settings.key_prefix), workers)
        return {name: node_status.device_of(name, status) for name, status in statuses.items()}
    except redis.RedisError as exc:
        log.warning("the workers' devices not read (%s): each worker priced as a device", exc)
        return {}
    finally:
        client.close()


def cmd_submit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from producer.client import Producer
    from workers.models.registry import token_counter
    from workers.tools.bulk import JobOptions, exit_code, print_summary, submit_file
    from workers.tools.bulk_files import default_job_id

    settings = load_settings()
    model = args.model
    price = args.gpu_cost_per_hour or settings.gpu_cost_per_hour
    # Tokens are counted by the model's own cost(), which needs its backend configured here.
    backend_here = settings.models.get(model)
    source, output = Path(args.file), Path(args.output)
    options = JobOptions(
        job_id=args.job_id or default_job_id(source, output),
        window=args.window,
        deadline_s=args.deadline,
        count_tokens=token_counter(backend_here) if price and backend_here else None,
    )
    with Producer(settings) as producer:
        producer.policy(model)  # a model neither the fleet nor this config serves: refused
        report = submit_file(
            producer,
            model,
            source,
            output,
            Path(args.errors) if args.errors else None,
            options=options,
        )
    if price:
        report.device_of = _worker_devices(settings, report.workers())
    print_summary(report, model, args.file, options.job_id, price)
    return exit_code(report)


def cmd_flower(args: argparse.Namespace) -> int:
    import os

    from workers.protocol.celery_app import make_celery_app

    if ":" not in os.environ.get("FLOWER_BASIC_AUTH", ""):
        raise ConfigError("set FLOWER_BASIC_AUTH=user:password: Flower shows every batch")
    app = make_celery_app(load_settings())
    # The broker URL and the credentials stay out of argv (ps); Flower reads FLOWER_* itself.
    app.start(["flower", f"--port={args.port}", f"--address={args.address}"])
    return 0


def cmd_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from config.garbage_collection import settle_garbage_collection
    from workers.gateway.app import create_app

    app = create_app(load_settings())
    settle_garbage_collection()
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GATEWAY_GRACE_S,
        timeout_keep_alive=GATEWAY_KEEP_ALIVE_S,
    )
    uvicorn.Server(config).run()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from workers.tools.demo import run_demo

    return run_demo(requests=args.requests, baseline=args.baseline, backend=args.model)


def cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workers.runtime.gpu import gpu_count
    from workers.tools.bench import BenchConfig, run_bench

    gpus = gpu_count() if args.gpu else 0
    if args.gpu and not gpus:
        raise ConfigError("--gpu: NVML finds no GPU on this machine")
    config = BenchConfig(
        mode=args.mode,
        requests=args.requests,
        inflight=args.inflight,
        rate=args.rate,
        duration_s=args.duration,
        rates=tuple(float(rate) for rate in args.rates),
        workers=args.workers,
        backend=args.backend,
        max_batch_size=args.max_batch_size,
        max_wait_s=args.max_wait_s,
        base_ms=args.base_ms,
        per_item_ms=args.per_item_ms,
        launch_ms=args.launch_ms,
        threads=args.threads,
        weights=args.weights,
        group_by_cost=args.group_by_cost,
        gpus=gpus,
        pin_cores=not args.no_pin,
        baseline=args.baseline,
        gpu_cost_per_hour=args.gpu_cost_per_hour or load_settings().gpu_cost_per_hour,
        out_dir=Path(args.out),
    )
    return run_bench(config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchfleet", description="Micro-batching inference fleet on Redis and Celery."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    worker = commands.add_parser(
        "worker",
        help="run GPU-pinned Celery workers: one process per GPU, or one CPU worker if none",
    )
    placement = worker.add_mutually_exclusive_group()
    placement.add_argument(
        "--gpu",
        type=_gpu_choice,
        help="pin this process to GPU N, or 'auto': the first place on a GPU no live worker "
        "claimed (replicas of one container service that sees every GPU take one each; "
        "worker.processes_per_gpu places per GPU)",
    )
    placement.add_argument(
        "--gpus",
        choices=["all"],
        help="pinned processes on every GPU, worker.processes_per_gpu on each (the default)",
    )
    placement.add_argument("--cpu", action="store_true", help="one process on the CPU")
    worker.add_argument("--model", action="append", help="serve only this model (repeatable)")
    worker.add_argument("--name", help="Celery node name (default gpuN@host or cpu-PID@host)")
    worker.add_argument(
        "--core",
        type=non_negative_int,
        help="pin this process to CPU core N, where its threads pass their one interpreter "
        "between them faster: for a worker whose model computes on a GPU, not on the CPU",
    )
    worker.add_argument(
        "--metrics-port",
        type=port_number,
        help="serve Prometheus /metrics on this port (with --gpus all: port + GPU index x "
        "processes per GPU + place on the GPU)",
    )
    worker.set_defaults(handler=cmd_worker)

    batcher = commands.add_parser("batcher", help="run the micro-batcher")
    batcher.add_argument("--model", action="append", help="batch only this model (repeatable)")
    batcher.add_argument("--name", help="consumer name, unique per batcher (default batcher@host)")
    batcher.add_argument(
        "--metrics-port", type=port_number, help="serve Prometheus /metrics on this port"
    )
    batcher.set_defaults(handler=cmd_batcher)

    top = commands.add_parser("top", help="a live view of the fleet (Ctrl-C to leave)")
    top.add_argument("--model", action="append", help="show only this model (repeatable)")
    top.add_argument(
        "--refresh", type=refresh_seconds, default=1.0, help="seconds between redraws (>= 0.1)"
    )
    top.add_argument("--gpu-cost-per-hour", type=positive_float, help="price of one device-hour")
    top.set_defaults(handler=cmd_top)

    submit = commands.add_parser(
        "submit", help="run a JSONL file of requests through the fleet (a rerun resumes)"
    )
    submit.add_argument("file", help="one request a line: {custom_id, input} or OpenAI Batch")
    submit.add_argument("--model", required=True)
    submit.add_argument("-o", "--output", required=True, help="answers, appended as they come")
    submit.add_argument("--errors", help="error lines (default: OUTPUT with .errors.jsonl)")
    submit.add_argument(
        "--job-id",
        help="the job the custom_ids belong to (default: this file into this output, so that "
        "a rerun resumes); another job may reuse the custom_ids for other inputs",
    )
    submit.add_argument(
        "--window", type=positive_int, default=2048, help="lines in flight per wave"
    )
    submit.add_argument(
        "--deadline",
        type=positive_float,
        default=24 * 3600.0,
        help="seconds a request may wait (24 h)",
    )
    submit.add_argument(
        "--gpu-cost-per-hour",
        type=positive_float,
        help="price of one device-hour: report the run's cost",
    )
    submit.set_defaults(handler=cmd_submit)

    flower = commands.add_parser(
        "flower", help="Flower on the fleet's broker, behind FLOWER_BASIC_AUTH=user:password"
    )
    flower.add_argument("--port", type=port_number, default=5555)
    flower.add_argument("--address", default="127.0.0.1", help="0.0.0.0 in a container")
    flower.set_defaults(handler=cmd_flower)

    gateway = commands.add_parser(
        "gateway", help="the fleet behind an OpenAI-compatible HTTP API (needs an API key)"
    )
    gateway.add_argument("--port", type=port_number, default=8000)
    gateway.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in a container")
    gateway.set_defaults(handler=cmd_gateway)

    demo = commands.add_parser("demo", help="start a private fleet and show what batching buys")
    demo.add_argument(
        "--requests", type=positive_int, default=2000, help="requests in the batched run"
    )
    demo.add_argument(
        "--baseline",
        type=non_negative_int,
        default=2000,
        help="requests sent again with one request per model call, for comparison",
    )
    demo.add_argument(
        "--model",
        choices=["synthetic", "embedding"],
        default="synthetic",
        help="the synthetic GPU-like model, or MiniLM embeddings (needs the embedding extra)",
    )
    demo.set_defaults(handler=cmd_demo)

    bench = commands.add_parser("bench", help="measure a private fleet under load")
    bench.add_argument("mode", choices=["saturate", "rate", "sweep"])
    bench.add_argument("--requests", type=positive_int, default=5000, help="saturate: how many")
    bench.add_argument(
        "--inflight",
        type=non_negative_int,
        default=0,
        help="saturate: requests in flight (0: all at once)",
    )
    bench.add_argument(
        "--rate", type=positive_float, default=200.0, help="rate: requests per second"
    )
    bench.add_argument(
        "--duration", type=positive_float, default=20.0, help="rate, sweep: seconds each"
    )
    bench.add_argument(
        "--rates", type=rate_list, default=(50, 100, 200, 400, 600, 800), help="sweep: req/s list"
    )
    bench.add_argument("--workers", type=positive_int, default=1, help="CPU workers to start")
    bench.add_argument(
        "--backend",
        choices=["synthetic", "embedding"],
        default="synthetic",
        help="the model: a GPU-like sleep, or MiniLM embeddings on this CPU (needs the extra)",
    )
    bench.add_argument("--threads", type=positive_int, help="embedding: torch threads per worker")
    bench.add_argument(
        "--weights", help="embedding: a folder holding the model (default: the installed package)"
    )
    bench.add_argument(
        "--group-by-cost",
        action="store_true",
        help="batch inputs of similar cost (embedding: tokens) together",
    )
    bench.add_argument(
        "--gpu",
        action="store_true",
        help="pin the workers to this machine's GPUs (round-robin) and sample them with NVML",
    )
    bench.add_argument(
        "--no-pin",
        action="store_true",
        help="leave the synthetic model's workers unpinned (by default each runs pinned to a "
        "CPU core, as a worker whose model computes on a GPU runs best)",
    )
    bench.add_argument("--max-batch-size", type=positive_int, default=32)
    bench.add_argument("--max-wait-s", type=non_negative_float, default=0.015)
    bench.add_argument(
        "--base-ms", type=non_negative_float, default=20.0, help="synthetic cost per batch"
    )
    bench.add_argument(
        "--per-item-ms", type=non_negative_float, default=0.5, help="synthetic cost per item"
    )
    bench.add_argument(
        "--launch-ms",
        type=non_negative_float,
        default=0.0,
        help="synthetic: Python (holding the GIL) that launches each batch, as eager PyTorch does",
    )
    bench.add_argument(
        "--baseline", action="store_true", help="also run the same load one request per model call"
    )
    bench.add_argument(
        "--gpu-cost-per-hour",
        type=positive_float,
        help="price of one device-hour: report cost per 1,000 requests and of idle time",
    )
    bench.add_argument("--out", default="benchmarks/results", help="folder for JSON and PNGs")
    bench.set_defaults(handler=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.handler(args))
    except BatchfleetError as exc:
        print(f"batchfleet: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place an unexpected failure becomes one clear line
        print(f"batchfleet: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
