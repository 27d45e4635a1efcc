"""Producer cost: CPU per request of ``submit_many`` and of ``AsyncProducer`` callers, and the
connections while 10,000 wait.

Run: .venv/bin/python benchmarks/producer_cost.py [--requests 10000] [--repeat 5] [--callers 256]
Needs only a redis-server (started privately); no fleet. ``submit_many`` is timed with nothing
draining the queue. For the callers (each an ``AsyncProducer.submit`` then its ``result``, the
closed loop of ``pipeline_cpu.py --callers``) a stand-in for the fleet, in a process of its
own, reads each request from the model's stream and pushes an answer to the producer's inbox:
the figure is the CPU of the producer's event-loop thread alone, per request, Redis and the
stand-in left out.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time

import redis

from config.keys import Keys
from config.schema import STREAM_FIELD, Request, ResultEncoder, output_json
from config.settings import ModelPolicy, Settings, load_settings
from producer.async_client import AsyncProducer
from producer.client import Producer
from workers.local.local_redis import LocalRedis

MODEL = "synthetic"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--callers", type=int, default=256)
    args = parser.parse_args()
    inputs = [{"text": f"sentence number {index}", "n": index} for index in range(args.requests)]
    with LocalRedis() as server:
        settings = load_settings(
            redis_url=server.url, models={MODEL: ModelPolicy(max_queue_len=10_000_000)}
        )
        per_request_us = []
        with Producer(settings) as producer:
            for _ in range(args.repeat):
                started = time.perf_counter()
                ids = producer.submit_many(MODEL, inputs)
                per_request_us.append((time.perf_counter() - started) / len(ids) * 1e6)
            waiting = producer.results(ids, timeout_s=0.5)
            try:
                next(waiting)
            except Exception as exc:  # nothing runs the queue: the wait times out
                outcome = type(exc).__name__
            clients = redis.Redis.from_url(server.url).client_list()
        redis.Redis.from_url(server.url).delete(Keys(settings.key_prefix).stream(MODEL))
        callers_us = [callers_cpu_us(settings, inputs, args.callers) for _ in range(args.repeat)]
    print(
        f"submit_many of {args.requests} requests, {args.repeat} runs: "
        f"median {statistics.median(per_request_us):.1f} us/request "
        f"(min {min(per_request_us):.1f}, max {max(per_request_us):.1f})"
    )
    print(
        f"waiting on {len(ids)} pending requests: {len(clients) - 1} producer connections "
        f"to Redis (the wait ended with {outcome})"
    )
    print(
        f"AsyncProducer, {args.callers} callers each submit then result, {args.requests} "
        f"requests, {args.repeat} runs: median {statistics.median(callers_us):.1f} us/request "
        f"of the producer's CPU (min {min(callers_us):.1f}, max {max(callers_us):.1f})"
    )


def callers_cpu_us(settings: Settings, inputs: list[object], callers: int) -> float:
    """The producer's CPU per request (its loop thread's) while ``callers`` coroutines each
    submit their next input and await its result, answered by ``answer_all``."""
    producer = AsyncProducer(settings)
    answering = multiprocessing.Process(
        target=answer_all,
        args=(settings.redis_url.get_secret_value(), settings.key_prefix, producer.producer_id),
        daemon=True,
    )
    answering.start()
    try:
        return asyncio.run(closed_loop(producer, inputs, callers)) / len(inputs) * 1e6
    finally:
        answering.terminate()
        answering.join()


async def closed_loop(producer: AsyncProducer, inputs: list[object], callers: int) -> float:
    """The loop thread's CPU seconds for ``callers`` coroutines sending every input."""
    unsent = iter(inputs)

    async def caller() -> None:
        for value in unsent:
            await producer.result(await producer.submit(MODEL, value))

    async with producer:
        await producer.result(await producer.submit(MODEL, "warm-up"))
        started = time.thread_time()
        await asyncio.gather(*(caller() for _ in range(callers)))
        return time.thread_time() - started


def answer_all(url: str, key_prefix: str, producer_id: str) -> None:
    """The fleet's stand-in: answers each request added to the model's stream, in its order,
    by pushing its result to the producer's inbox, 32 at a time at most."""
    keys = Keys(key_prefix)
    client = redis.Redis.from_url(url)
    stream, inbox, last = keys.stream(MODEL), keys.inbox(MODEL, producer_id), "0"
    while True:
        for _, entries in client.xread({stream: last}, count=32, block=1000):
            last = entries[-1][0]
            client.rpush(inbox, *(answer(fields[STREAM_FIELD.encode()]) for _, fields in entries))


def answer(encoded_request: bytes) -> str:
    """A result for the request ``encoded_request``, written as a worker writes it."""
    request = Request.decode(encoded_request)
    output = output_json({"echo": request.input})
    results = ResultEncoder(MODEL, "stand-in", "b-1", 32, 0.0, "w0", time.time())
    return results.encode(request, output, "size")


if __name__ == "__main__":
    main()
