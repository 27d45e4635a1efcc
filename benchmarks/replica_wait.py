"""What the replica wait costs: the same saturation run on a Redis Sentinel group with
``BATCHFLEET_REDIS_WAIT_REPLICAS`` 0 and 1, alternated.

Run: .venv/bin/python benchmarks/replica_wait.py [--rounds 2] [bench arguments...]
It starts a Sentinel group on loopback (a master, one replica, three sentinels), then runs
``batchfleet bench`` against it (a private fleet under a fresh key prefix) with the wait off
and on, ``--rounds`` times each, alternating, and prints each run's summary. The bench
arguments default to ``saturate --requests 5000`` (the synthetic model at its defaults);
``rate --rate 200 --duration 15`` gives the latency.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from workers.local.sentinel_group import NAME, SentinelGroup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args, bench_args = parser.parse_known_args()
    bench_args = bench_args or ["saturate", "--requests", "5000"]
    with SentinelGroup() as group:
        for round_number in range(1, args.rounds + 1):
            for replicas in (0, 1):
                env = {
                    **os.environ,
                    "BATCHFLEET_REDIS_URL": group.url,
                    "BATCHFLEET_REDIS_SENTINEL_MASTER": NAME,
                    "BATCHFLEET_REDIS_WAIT_REPLICAS": str(replicas),
                }
                command = [sys.executable, "-m", "workers.cli", "bench", *bench_args]
                run = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                lines = [line for line in run.stdout.splitlines() if line.strip()]
                print(f"round {round_number}, wait for {replicas} replica(s):")
                print("\n".join(f"  {line}" for line in lines[-6:]))


if __name__ == "__main__":
    main()
