"""Marks each test by its folder (``tests/integration`` → integration, ``tests/unit`` → unit,
``tests/chaos`` → chaos and slow), names the redis-server the session runs on, and fails any
test that leaves a process or a temp folder behind, or that made a Lua script call in this
process whose keys span more than one hash slot (Redis Cluster refuses those).

Every process the suite starts carries ``SESSION_MARK`` in its environment, and every temp
folder lands in one folder of the session's own; both are checked after each test and
cleared when the session ends, also when a test failed. Every process also has the project
root on its ``PYTHONPATH``: fleet processes load test-only models and scripts
(``tests.chaos.ledger_model``…) by module name, wherever pytest runs from.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.script_slots import ScriptCalls, recorded_script_calls
from workers.local.local_redis import describe_redis_server, redis_server_binary

ROOT = Path(__file__).parent
SESSION_MARK = "BF_TEST_SESSION"
LEFTOVER_WAIT_S = 15.0
# Caches kept by pytest and torch for their whole run, not made by a test: removed with the
# session's temp folder at the end.
LIBRARY_CACHES = ("pytest-of-", "torchinductor_")


SESSION_TMP_PREFIX = "batchfleet-tests-"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: no sockets, no subprocesses")
    config.addinivalue_line("markers", "tls: needs a redis-server built with TLS")
    session_tmp = tempfile.mkdtemp(prefix=SESSION_TMP_PREFIX)
    os.environ["TMPDIR"] = session_tmp
    tempfile.tempdir = session_tmp
    os.environ[SESSION_MARK] = uuid.uuid4().hex
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT.parent), *([inherited] if inherited else [])]
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    for pid in marked_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    session_tmp = Path(tempfile.gettempdir())
    if session_tmp.name.startswith(SESSION_TMP_PREFIX):  # never the system's temp folder
        shutil.rmtree(session_tmp, ignore_errors=True)


def pytest_report_header() -> str:
    return f"redis-server: {describe_redis_server(redis_server_binary())}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).relative_to(ROOT).parts[0]
        if folder in ("unit", "integration"):
            item.add_marker(folder)
        elif folder == "chaos":
            item.add_marker("chaos")
            item.add_marker("slow")


def marked_processes() -> set[int]:
    """Live processes started by this session (pytest itself excluded)."""
    mark = f"{SESSION_MARK}={os.environ[SESSION_MARK]}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
    return found


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "(gone)"


def temp_entries() -> set[str]:
    return {
        name for name in os.listdir(tempfile.gettempdir()) if not name.startswith(LIBRARY_CACHES)
    }


@pytest.fixture(autouse=True)
def leaves_nothing_behind() -> Iterator[None]:
    """After the test and its fixtures: every process it started has exited (waited for up to
    15 s, then killed) and every temp folder it made is gone, or the test errors."""
    processes_before, temp_before = marked_processes(), temp_entries()
    yield
    give_up = time.monotonic() + LEFTOVER_WAIT_S
    while (left := marked_processes() - processes_before) and time.monotonic() < give_up:
        time.sleep(0.05)
    described = [f"{pid}: {command_line(pid)}" for pid in sorted(left)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    temp_left = sorted(temp_entries() - temp_before)
    for name in temp_left:
        shutil.rmtree(Path(tempfile.gettempdir()) / name, ignore_errors=True)
    assert not described, "processes left running:\n" + "\n".join(described)
    assert not temp_left, f"temp folders left behind: {temp_left}"


@pytest.fixture(autouse=True)
def script_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptCalls]:
    """Every Lua script call the test makes in this process; each must touch one hash slot."""
    with recorded_script_calls(monkeypatch) as calls:
        yield calls
    spanning = calls.cross_slot()
    assert not spanning, f"script calls across hash slots: {spanning[:3]}"
