"""The worker's side: `prepare_worker` gated by the toggle and never raising, a sweep's
log lines (`log_report`, what exo's worker hook logs), and `sweep_async` giving way to
its caller's cancellation."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from loguru import logger

from exo_orphan_guard import system
from exo_orphan_guard.exo import worker
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import sweep, sweep_async
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, current_identity, liveness
from tests.conftest import StartWorker
from tests.helpers.processes import make_fake_exo_environment
from tests.helpers.sweeps import busy_orphan
from tests.helpers.waiting import wait_until


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    lines: list[str] = []
    handler = logger.add(lambda message: lines.append(str(message)), level="DEBUG")
    yield lines
    logger.remove(handler)


async def test_everything_is_a_no_op_with_the_toggle_off(log_lines: list[str]) -> None:
    worker.prepare_worker()
    assert settings.WORKER_ENV not in os.environ
    assert log_lines == []


async def test_prepare_worker_records_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "1")
    worker.prepare_worker()
    assert ProcessIdentity.decode(os.environ[settings.WORKER_ENV]) == current_identity()
    monkeypatch.delenv(settings.WORKER_ENV)


async def test_bad_toggle_warns_once(monkeypatch: pytest.MonkeyPatch, log_lines: list[str]) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "sometimes")
    for _ in range(3):
        worker.prepare_worker()
        assert settings.WORKER_ENV not in os.environ
    assert sum("'sometimes'" in line for line in log_lines) == 1


@pytest.mark.machine_wide
def test_a_sweeps_kills_are_logged_with_its_summary(log_lines: list[str], tmp_path: Path) -> None:
    python = make_fake_exo_environment(tmp_path / "exo-env")
    stranded = scenarios.start_worker(["idle"], watch="none", python=python)
    try:
        scenarios.kill_worker(stranded)
        (orphan,) = stranded.all_processes()
        report = sweep()
        assert orphan.pid in {result.target.pid for result in report.results}
        worker.log_report(report, "worker start")
        assert any(f"ended orphan {orphan.pid}" in line for line in log_lines), log_lines
        assert any("sweep before worker start: " in line for line in log_lines), log_lines
    finally:
        scenarios.cleanup(stranded)


BUSY_WAIT = 20.0
"""Far longer than any bound below: a sweep that waited it out would fail them."""


def lock_is_free(registry: Path) -> bool:
    opened, _ = Registry.open(registry, create=False)
    assert opened is not None
    with opened.locked(0.0) as acquired:
        return acquired


@pytest.mark.machine_wide
async def test_a_cancelled_sweep_gives_way_at_once_and_leaves_a_busy_runner_to_its_watchdog(
    monkeypatch: pytest.MonkeyPatch,
    start_worker: StartWorker,
    isolated_environment: Path,
) -> None:
    """A caller cancels the task awaiting a sweep (Ctrl-C, an event loop torn down) while
    the sweep waits for a busy runner: the cancellation goes through at once, not when
    the wait ends, and the sweep lets go of the lock and never signals the runner."""
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(BUSY_WAIT))
    runner = busy_orphan(start_worker, isolated_environment)
    waits: list[str] = []
    cancelled_at = float("inf")

    async def sweeping() -> None:
        await sweep_async(on_wait=waits.append)

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(sweeping)
            while not any(f"waiting for runner {runner.pid}" in line for line in waits):
                await anyio.sleep(0.01)
            cancelled_at = time.monotonic()
            scope.cancel()
    given_way = time.monotonic() - cancelled_at
    assert given_way < 5.0, f"the cancellation waited {given_way:.1f} s for the sweep"
    assert wait_until(lambda: lock_is_free(isolated_environment), 1.0), "the lock is still held"
    assert liveness(runner) == "alive" and system.is_stopped(runner.pid) is False
