"""Orphans for sweep tests, and what a sweep did to them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweep_report import SweepReport
from exo_orphan_guard.system.identity import ProcessIdentity
from tests.helpers.processes import gone_within
from tests.helpers.waiting import wait_until

if TYPE_CHECKING:
    from tests.conftest import StartWorker


def orphaned_runners(worker: scenarios.StartedWorker) -> list[ProcessIdentity]:
    """SIGKILL `worker` and return its runners and their children, checked alive."""
    scenarios.kill_worker(worker)
    time.sleep(0.3)
    members = worker.all_processes()
    assert scenarios.alive(members) == members, "the planted orphans should outlive their worker"
    return members


def gone(processes: list[ProcessIdentity]) -> bool:
    """Gone within 2 s: a sweep has already sent its kills when this is asked."""
    return gone_within(processes, 2.0)


def killed_pids(report: SweepReport) -> set[int]:
    return {result.target.pid for result in report.results if result.outcome == "killed"}


def busy_orphan(start_worker: StartWorker, registry: Path) -> ProcessIdentity:
    """A guarded runner in native code holding the GIL, its worker SIGKILLed and its
    watchdog's `busy` recorded: a sweep waits for it, up to EXO_ORPHAN_GUARD_BUSY_WAIT."""
    started = start_worker(["gil"])
    runner = started.runners[0].identity
    time.sleep(scenarios.GIL_SETTLE_SECONDS)  # inside its native call
    scenarios.kill_worker(started)
    path = host_directory(registry) / endings.ENDINGS_NAME

    def recorded_busy() -> bool:
        latest = endings.latest(endings.read(path, system.boot_id())).get(runner)
        return latest is not None and latest.event == "busy"

    assert wait_until(recorded_busy, 10.0), "its watchdog never recorded it busy"
    return runner
