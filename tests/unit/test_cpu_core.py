"""A worker pinned to a CPU core: refused a core it may not run on, or the prefork pool, with
one clear line and nothing pinned; and the cores a private fleet gives its workers."""

from __future__ import annotations

import os

import pytest

from config.errors import ConfigError
from config.settings import load_settings
from workers.cli.main import build_parser, cmd_worker
from workers.runtime import cpu_core
from workers.runtime.process import run_worker

linux_only = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="pinning to a core is Linux's"
)


@linux_only
def test_a_core_the_process_may_not_run_on_is_refused_naming_those_it_may() -> None:
    allowed = os.sched_getaffinity(0)
    absent = max(allowed) + 1
    with pytest.raises(ConfigError) as refused:
        cpu_core.pin_to_core(absent)
    assert str(refused.value) == f"--core {absent}: this process may run on cores {sorted(allowed)}"
    assert os.sched_getaffinity(0) == allowed


@linux_only
def test_the_prefork_pool_is_refused_a_core() -> None:
    """Its children, forked from the pinned parent, would all run on the one core."""
    allowed = os.sched_getaffinity(0)
    settings = load_settings(worker={"pool": "prefork"})
    with pytest.raises(ConfigError, match="prefork"):
        run_worker(settings, ["synthetic"], gpu=None, core=min(allowed))
    assert os.sched_getaffinity(0) == allowed


def test_a_core_for_several_processes_is_refused_before_redis_is_asked() -> None:
    """``--core`` names one process's core: without ``--gpu N`` or ``--cpu`` the command
    would start one process per GPU."""
    args = build_parser().parse_args(["worker", "--core", "0"])
    with pytest.raises(ConfigError, match=r"^--core pins one process: use it with --gpu N or"):
        cmd_worker(args)


@linux_only
def test_a_private_fleets_workers_get_a_core_each_the_last_first() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    cores = cpu_core.spare_cores(len(allowed) + 1)
    assert cores[0] == allowed[-1]
    assert sorted(cores[: len(allowed)]) == allowed  # one each, before any core is shared
    assert cores[len(allowed)] == allowed[-1]


def test_without_linux_a_core_is_refused_and_a_private_fleet_runs_unpinned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    with pytest.raises(ConfigError, match="--core 0: pinning a process to a core needs Linux"):
        cpu_core.pin_to_core(0)
    assert cpu_core.spare_cores(2) == []
