"""Batcher and worker processes on this machine, for the demo, the benchmarks and the tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

STOP_TIMEOUT_S = 10.0


class LocalFleet:
    """Starts ``batchfleet`` processes with one environment and stops them all at the end."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env}
        self.log_dir = Path(tempfile.mkdtemp(prefix="batchfleet-fleet-"))
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(
        self, *args: str, module: str = "workers.cli", wrapper: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """Starts ``batchfleet ARGS…`` (or ``python -m MODULE ARGS…``), by ``wrapper`` when
        given (a command that runs another, such as ``ip netns exec NAME``); its output goes
        to a log file in ``log_dir``."""
        log_path = self.log_dir / f"{len(self.processes):02d}-{'-'.join(args)}.log"
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                [*wrapper, sys.executable, "-m", module, *args],
                env=self.env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def logs(self) -> str:
        """Every process's log, for a failure report."""
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')}"
            for path in sorted(self.log_dir.glob("*.log"))
        )

    def stop(self, process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
        """Signals ``process`` and its children and waits; SIGKILL if it lingers."""
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return int(process.returncode)

    def stop_all(self) -> None:
        for process in self.processes:
            self.stop(process)

    def close(self) -> None:
        """Stops every process and deletes the logs."""
        self.stop_all()
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> LocalFleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
