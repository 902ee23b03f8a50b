"""Orphans for sweep tests, and what a sweep did to them."""

from __future__ import annotations

import time

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweep_report import SweepReport
from exo_orphan_guard.system.identity import ProcessIdentity
from tests.helpers.processes import gone_within


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
