"""The hooks exo's worker calls: gated by the toggle, never raising, logging."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from exo_orphan_guard.exo import worker
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import SweepReport
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, current_identity
from tests.helpers.processes import make_fake_exo_environment


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
