"""What waking up costs on this host: how late a timed wait ends, and how much slower a round
trip to Redis is after its two ends sat idle, the two floors under a fleet's latency at low load.

Run: .venv/bin/python benchmarks/wake_costs.py [--rounds 300]
First, how late ``time.sleep`` ends for the waits a worker times (the device hand-over's
0.2 ms yield, a 2.64 ms batch of the fast synthetic model), in a thread with Linux's default
timer slack and in one started after ``tighten_timer_slack`` (as a worker's threads are).
Then a ``PING`` through redis-py to a private redis-server, and the same bytes on a raw
socket, back to back and after each pause: a process that slept ~20 ms, as every process of
a fleet at 200 req/s does between its events, pays the first call of its wake-up several
times over. Medians and 90th percentiles in µs.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial

import redis

from workers.local.local_redis import LocalRedis
from workers.runtime.timer_slack import tighten_timer_slack

SLEEPS_S = (0.0002, 0.00264)
PAUSES_S = (0.0, 0.001, 0.005, 0.02)
PING = b"*1\r\n$4\r\nPING\r\n"


def took_us(call: Callable[[], object], pause_s: float, rounds: int) -> list[float]:
    """``call``'s wall time in µs, each of ``rounds`` calls after ``pause_s`` asleep."""
    took = []
    for _ in range(rounds):
        if pause_s:
            time.sleep(pause_s)
        started = time.perf_counter()
        call()
        took.append((time.perf_counter() - started) * 1e6)
    return took


def median_p90(values: list[float]) -> str:
    return f"{statistics.median(values):7.0f} {statistics.quantiles(values, n=10)[-1]:7.0f}"


def sleep_lateness(label: str, rounds: int) -> None:
    """Prints how late each of ``SLEEPS_S`` ends in the calling thread."""
    for sleep_s in SLEEPS_S:
        took = took_us(partial(time.sleep, sleep_s), 0.0, rounds)
        late = median_p90([us - sleep_s * 1e6 for us in took])
        print(f"{label:<34} sleep {sleep_s * 1000:5.2f} ms: late {late}")


def in_new_thread(run: Callable[[], None]) -> None:
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    print("timed waits, µs late (median, p90)")
    in_new_thread(lambda: sleep_lateness("default timer slack", args.rounds))
    tighten_timer_slack()
    in_new_thread(lambda: sleep_lateness("a worker's (tighten_timer_slack)", args.rounds))
    print("round trip to redis-server, µs (median, p90), after each pause")
    with LocalRedis() as server:
        client = redis.Redis.from_url(server.url)
        client.ping()
        raw = client.connection_pool.get_connection()
        sock = raw._sock
        assert sock is not None

        def raw_ping() -> None:
            sock.sendall(PING)
            sock.recv(64)

        for pause_s in PAUSES_S:
            through_redis_py = median_p90(took_us(client.ping, pause_s, args.rounds))
            on_raw_socket = median_p90(took_us(raw_ping, pause_s, args.rounds))
            print(
                f"pause {pause_s * 1000:4.0f} ms: redis-py PING {through_redis_py}"
                f"   raw socket {on_raw_socket}"
            )
        client.connection_pool.release(raw)
        client.close()


if __name__ == "__main__":
    main()
