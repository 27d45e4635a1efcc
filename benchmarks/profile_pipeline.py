"""Where the pipeline's CPU goes under open-loop load: py-spy on the batcher, the worker and the
load generator (the producer) during ``batchfleet bench rate``.

Run: .venv/bin/pip install py-spy && .venv/bin/python benchmarks/profile_pipeline.py
     [--rate 200] [--seconds 15] [--out /tmp/batchfleet-profile]
Prints, per process (and redis-server), the CPU it used over the window (from /proc, in % of
one core), and py-spy's top functions by own samples; the raw stacks stay in ``--out``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from pipeline_cpu import process_cpu_s  # this folder, as a script runs

RATE_HZ = 100
ROLES = {
    "batcher": "workers.cli batcher",
    "worker": "workers.cli worker",
    "producer": "workers.cli bench",
    "redis-server": "redis-server",
}
FRAME = re.compile(r"^(?P<function>.*) \((?P<path>.*):(?P<line>\d+)\)$")


def wait_for_line(log: Path, marker: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while marker not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > deadline:
            raise SystemExit(f"the bench did not start:\n{log.read_text()}")
        time.sleep(0.2)


def pid_of(pattern: str) -> int:
    found = subprocess.run(["pgrep", "-n", "-f", pattern], capture_output=True, text=True)
    return int(found.stdout.split()[0])


def spy_command(pid: int, output: Path, seconds: int) -> list[str]:
    """py-spy sampling ``pid`` without pausing it, collapsed stacks to ``output``."""
    return [
        str(Path(sys.executable).with_name("py-spy")),
        *("record", "--format", "raw", "--rate", str(RATE_HZ), "--nonblocking"),
        *("--duration", str(seconds), "--output", str(output), "--pid", str(pid)),
    ]


def top_functions(raw: Path, count: int = 6) -> list[str]:
    """The functions with the most own samples in a py-spy raw (collapsed stacks) file."""
    own: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        match = FRAME.match(stack.split(";")[-1])
        name = f"{match['function']} ({Path(match['path']).name})" if match else stack
        own[name] += int(samples)
    total = sum(own.values()) or 1
    return [f"    {samples / total:5.1%}  {name}" for name, samples in own.most_common(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/batchfleet-profile"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "bench.log"
    command = [sys.executable, "-m", "workers.cli", "bench", "rate", "--rate", str(args.rate)]
    command += ["--duration", str(args.seconds + 6), "--out", str(args.out)]
    with open(log, "w") as log_file:
        bench = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        wait_for_line(log, "run ")
        time.sleep(2)  # past the first arrivals: sample the steady state
        pids = {role: pid_of(pattern) for role, pattern in ROLES.items()}
        cpu_before = {role: process_cpu_s(pid) for role, pid in pids.items()}
        started = time.monotonic()
        spies = {
            role: subprocess.Popen(
                spy_command(pid, args.out / f"{role}.txt", int(args.seconds)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for role, pid in pids.items()
            if role != "redis-server"
        }
        for spy in spies.values():
            spy.wait()
        elapsed = time.monotonic() - started
        cpu = {role: process_cpu_s(pid) - cpu_before[role] for role, pid in pids.items()}
        bench.wait()
    print("\n".join(line for line in log.read_text().splitlines() if " INFO " not in line))
    for role, used in cpu.items():
        print(f"{role}: {used / elapsed:6.1%} of one core")
        if role in spies:
            print("\n".join(top_functions(args.out / f"{role}.txt")))


if __name__ == "__main__":
    main()
