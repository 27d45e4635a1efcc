"""`batchfleet top` driven in a pseudo terminal against a running fleet."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable

from workers.local.local_fleet import LocalFleet

from .conftest import producer_for, takes_ctrl_c, wait_ready

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COLUMNS = 60


class Terminal:
    """The screen of a program on a pseudo terminal: a thread reads everything the program
    writes, as a real terminal would, until the program closes it."""

    def __init__(self, main_fd: int) -> None:
        self._fd = main_fd
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="pty-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not chunk:
                return
            with self._lock:
                self._chunks.append(chunk)

    def text(self) -> str:
        """What the terminal has shown so far, escape codes removed."""
        with self._lock:
            raw = b"".join(self._chunks)
        return ANSI.sub("", raw.decode(errors="replace"))

    def wait_for(self, shown: Callable[[str], bool], timeout_s: float = 60.0) -> str:
        """The screen's text once ``shown`` holds for it."""
        give_up = time.monotonic() + timeout_s
        while not shown(text := self.text()):
            assert time.monotonic() < give_up, f"never shown:\n{text[-3000:]}"
            time.sleep(0.05)
        return text

    def close(self) -> None:
        self._thread.join(timeout=10)
        os.close(self._fd)


def last_frame(text: str) -> str:
    return text[text.rfind("models") :]


def live_frame(text: str) -> bool:
    """A whole frame shows the model with requests going in and out, and the worker with a
    recent batch."""
    frame = last_frame(text)
    if "per 1,000 requests" not in frame:
        return False
    models = [line for line in frame.splitlines() if "synthetic" in line]
    workers = [line for line in frame.splitlines() if "w1@top" in line]
    if not models or not workers or "s ago" not in workers[0]:
        return False
    try:
        rate_in, rate_out = (float(cell) for cell in models[0].split()[2:4])
    except ValueError:
        return False
    return rate_in > 0 and rate_out > 0


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
            preexec_fn=takes_ctrl_c,
        )
        os.close(terminal)
        screen = Terminal(main)
        try:
            shown = screen.wait_for(live_frame)
            top.send_signal(signal.SIGINT)
            assert top.wait(timeout=30) == 0
        finally:
            stop.set()
            sender.join()
            if top.poll() is None:
                top.kill()
                top.wait()
            screen.close()
    frame = last_frame(shown)
    assert len([line for line in frame.splitlines() if "synthetic" in line]) == 1, frame
    assert max(len(line) for line in shown.splitlines()) <= COLUMNS
    assert "at 2/GPU-hour:" in frame
