"""Sweeps side by side and against churn, on real processes: concurrent sweeps take
turns and each orphan is killed once, a held lock makes a sweep wait, a lock file that
cannot be opened is a warning, and processes that come and go never crash a sweep."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweep_report import SweepReport
from exo_orphan_guard.sweeper.sweeping import sweep
from tests.conftest import StartWorker
from tests.helpers.sweeps import gone, killed_pids, orphaned_runners

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to plant processes")


@pytest.mark.machine_wide
def test_concurrent_sweeps_serialise_and_both_finish(
    exo_python: str, start_worker: StartWorker
) -> None:
    unguarded = scenarios.start_worker(["idle", "idle", "child"], watch="none", python=exo_python)
    guarded = start_worker(["gil", "gil"], strategy="poll")
    try:
        members = orphaned_runners(unguarded) + orphaned_runners(guarded)
        reports: list[SweepReport] = []
        threads = [
            threading.Thread(target=lambda: reports.append(sweep(grace=0.3))) for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(reports) == 3 and all(report.exit_code == 0 for report in reports)
        assert gone(members)
        ours = {member.pid for member in members}
        killed = [pid for report in reports for pid in killed_pids(report) if pid in ours]
        assert len(killed) == len(set(killed)) == 5
    finally:
        scenarios.cleanup(unguarded)


def test_a_held_lock_makes_a_sweep_wait(isolated_environment: Path) -> None:
    registry, _ = Registry.open(isolated_environment, create=True)
    assert registry is not None
    with registry.locked(1.0):
        assert sweep(lock_timeout=0.2, fingerprint=False).lock_acquired is False
        waited: list[float] = []
        thread = threading.Thread(
            target=lambda: waited.append(sweep(fingerprint=False).elapsed_seconds)
        )
        thread.start()
        time.sleep(0.5)
    thread.join()
    assert waited[0] >= 0.45


@pytest.mark.machine_wide
def test_a_lock_file_that_cannot_be_opened_is_a_warning(
    exo_python: str, isolated_environment: Path
) -> None:
    registry, _ = Registry.open(isolated_environment, create=True)
    assert registry is not None
    (registry.path / "sweep.lock").mkdir()  # open(O_RDWR) fails: EISDIR
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python)
    try:
        (runner,) = orphaned_runners(worker)
        report = sweep(grace=0.2)
        assert any("no lock file" in warning for warning in report.warnings), report.warnings
        assert runner.pid in killed_pids(report) and gone([runner])
    finally:
        scenarios.cleanup(worker)


@pytest.mark.machine_wide
def test_a_sweep_racing_process_churn_never_crashes(exo_python: str) -> None:
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            subprocess.run(
                [exo_python, "-c", "pass", "--multiprocessing-fork"],
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        reports = [sweep(grace=0.1) for _ in range(30)]
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert all(report.exit_code == 0 for report in reports)
