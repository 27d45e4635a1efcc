"""`batchfleet top` driven in a pseudo terminal against a running fleet."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable

from workers.local_fleet import LocalFleet

from .conftest import producer_for, wait_ready

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COLUMNS = 60


def read_for(fd: int, seconds: float) -> str:
    """What the terminal shows over ``seconds``, escape codes removed."""
    chunks, give_up = [], time.monotonic() + seconds
    while (left := give_up - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            try:
                chunks.append(os.read(fd, 65536))
            except OSError:
                break
    return ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def test_top_shows_the_live_fleet_on_a_narrow_terminal_and_leaves_on_ctrl_c(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """While requests flow, the view shows the model with requests going out, and the worker
    with a recent batch, within 60 columns; Ctrl-C ends it with exit code 0."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu", "--name", "w1@top")
    stop = threading.Event()
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)

        def traffic() -> None:
            while not stop.is_set():
                ids = producer.submit_many("synthetic", [f"x{n}" for n in range(20)])
                list(producer.results(ids, timeout_s=30))

        sender = threading.Thread(target=traffic)
        sender.start()
        main, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
        env = {**os.environ, **fleet.env, "TERM": "xterm-256color"}
        env.pop("COLUMNS", None)
        top = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "top",
                "--refresh",
                "0.5",
                "--gpu-cost-per-hour",
                "2",
            ],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            env=env,
        )
        os.close(terminal)
        try:
            shown = read_for(main, 4.0)
            top.send_signal(signal.SIGINT)
            assert top.wait(timeout=10) == 0
        finally:
            stop.set()
            sender.join()
            if top.poll() is None:
                top.kill()
            os.close(main)
    frame = shown[shown.rfind("models") :]
    assert "synthetic" in frame and "w1@top" in frame, shown
    (row,) = [line for line in frame.splitlines() if "synthetic" in line]
    queue, rate_in, rate_out = (float(cell) for cell in row.split()[1:4])
    assert rate_out > 0 and rate_in > 0 and queue >= 0, row
    (worker,) = [line for line in frame.splitlines() if "w1@top" in line]
    assert "s ago" in worker, worker
    assert max(len(line) for line in shown.splitlines()) <= COLUMNS
    assert "at 2/GPU-hour:" in frame and "per 1,000 requests" in frame
