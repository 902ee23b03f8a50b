"""The hooks exo's worker calls: gated by the toggle, never raising, logging."""

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
from exo_orphan_guard.sweeper.sweep_report import SweepReport
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
    assert await worker.worker_sweep("connect to group") is None
    assert log_lines == []


async def test_prepare_worker_records_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "1")
    worker.prepare_worker()
    assert ProcessIdentity.decode(os.environ[settings.WORKER_ENV]) == current_identity()
    monkeypatch.delenv(settings.WORKER_ENV)


@pytest.mark.machine_wide
async def test_worker_sweep_runs_and_logs(
    monkeypatch: pytest.MonkeyPatch, log_lines: list[str]
) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "true")
    report = await worker.worker_sweep("connect to group")
    assert isinstance(report, SweepReport)
    assert any("sweep before connect to group" in line for line in log_lines)


async def test_a_failing_sweep_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, log_lines: list[str]
) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "1")

    async def broken(**_options: object) -> SweepReport:
        raise OSError("disk on fire")

    monkeypatch.setattr(worker, "sweep_async", broken)
    assert await worker.worker_sweep("worker start") is None
    assert any("failed" in line and "disk on fire" in line for line in log_lines)


async def test_bad_toggle_warns_once(monkeypatch: pytest.MonkeyPatch, log_lines: list[str]) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "sometimes")
    for _ in range(3):
        worker.prepare_worker()
        assert await worker.worker_sweep("worker start") is None
    assert sum("'sometimes'" in line for line in log_lines) == 1


@pytest.mark.machine_wide
async def test_start_up_sweep_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "1")
    monkeypatch.setattr(worker, "_started_in_this_process", False)
    assert await worker.sweep_at_worker_start() is not None
    assert await worker.sweep_at_worker_start() is None


@pytest.mark.machine_wide
async def test_a_recognised_runner_failure_is_explained_and_swept(
    monkeypatch: pytest.MonkeyPatch, log_lines: list[str], tmp_path: Path
) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "1")
    python = make_fake_exo_environment(tmp_path / "exo-env")
    stranded = scenarios.start_worker(["idle"], watch="none", python=python)
    try:
        scenarios.kill_worker(stranded)
        (orphan,) = stranded.all_processes()
        message = (
            "Terminated (exitcode=1)\nRunner error: ValueError: "
            "[jaccl] Changing queue pair to RTR failed with errno 16"
        )
        diagnosis = await worker.diagnose_runner_failure(message)
        assert diagnosis is not None and diagnosis.explanations[0].key == "rtr-errno-16"
        assert diagnosis.sweep is not None and orphan.pid in {
            v.pid for v in diagnosis.sweep.targets
        }
        assert scenarios.wait_gone([orphan], 2.0)[orphan] is not None
        assert any("runner failed: errno 16 (EBUSY)" in line for line in log_lines)
        assert any("killed orphan" in line for line in log_lines)
    finally:
        scenarios.cleanup(stranded)


async def test_unrecognised_failures_and_the_toggle_off_do_nothing(
    monkeypatch: pytest.MonkeyPatch, log_lines: list[str]
) -> None:
    assert await worker.diagnose_runner_failure("errno 16") is None  # toggle off
    monkeypatch.setenv(settings.TOGGLE_ENV, "1")
    assert await worker.diagnose_runner_failure("Terminated (exitcode=1)") is None
    assert log_lines == []


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
    log_lines: list[str],
    start_worker: StartWorker,
    isolated_environment: Path,
) -> None:
    """exo cancels the task awaiting a sweep (Ctrl-C, a Worker torn down at an election)
    while the sweep waits for a busy runner: the cancellation goes through at once, not
    when the wait ends, and the sweep lets go of the lock and never signals the runner."""
    monkeypatch.setenv(settings.TOGGLE_ENV, "1")
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(BUSY_WAIT))
    runner = busy_orphan(start_worker, isolated_environment)
    cancelled_at = float("inf")
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(worker.worker_sweep, "connect to group")
            while not any(f"waiting for runner {runner.pid}" in line for line in log_lines):
                await anyio.sleep(0.01)
            cancelled_at = time.monotonic()
            scope.cancel()
    given_way = time.monotonic() - cancelled_at
    assert given_way < 0.5, f"the cancellation waited {given_way:.1f} s for the sweep"
    assert wait_until(lambda: lock_is_free(isolated_environment), 1.0), "the lock is still held"
    assert liveness(runner) == "alive" and system.is_stopped(runner.pid) is False


@pytest.mark.machine_wide
async def test_the_sweep_after_a_runner_failure_runs_in_a_cancelled_scope_and_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
    log_lines: list[str],
    start_worker: StartWorker,
    isolated_environment: Path,
    tmp_path: Path,
) -> None:
    """exo diagnoses from a scope it has just cancelled (`_check_runner` from its runner
    watch): the sweep still kills the orphan it can, and holds the failure path up for
    no more than its bound, however long a busy runner would keep it waiting."""
    monkeypatch.setenv(settings.TOGGLE_ENV, "1")
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(BUSY_WAIT))
    monkeypatch.setattr(worker, "DIAGNOSIS_SWEEP_SECONDS", 1.0)
    python = make_fake_exo_environment(tmp_path / "exo-env")
    stranded = scenarios.start_worker(["idle"], watch="none", python=python)
    try:
        scenarios.kill_worker(stranded)
        (orphan,) = stranded.all_processes()
        runner = busy_orphan(start_worker, isolated_environment)
        message = "Runner error: [jaccl] Changing queue pair to RTR failed with errno 16"
        diagnosis: worker.FailureDiagnosis | None = None
        began = time.monotonic()
        with anyio.CancelScope() as scope:
            scope.cancel()
            diagnosis = await worker.diagnose_runner_failure(message)
        took = time.monotonic() - began
        assert diagnosis is not None and diagnosis.sweep is None
        assert 1.0 <= took < 2.0, took
        assert scenarios.wait_gone([orphan], 2.0)[orphan] is not None
        assert liveness(runner) == "alive"
        assert any("not done in 1 s" in line for line in log_lines), log_lines
    finally:
        scenarios.cleanup(stranded)
