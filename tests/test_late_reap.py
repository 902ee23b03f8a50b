"""Death seen at exit, not at reap: the worker's own parent reaps it 10 s late.

A dead worker stays a zombie until its parent reaps it; exo under a busy supervisor
(or launchd) may be reaped late. psutil's `Process.wait()` on a process that is not
our child returns only at reap; every waiter the guard uses must fire at exit.
"""

from __future__ import annotations

import time

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.system import settings
from exo_orphan_guard.watch.waiters import can_use_pidfd
from tests.conftest import StartWorker

REAP_AFTER_SECONDS = 10.0
GONE_WITHIN_SECONDS = 8.0
"""Below the reap delay, so that what goes went before the reap; met at once when every
waiter fires at exit (how soon is `make bench`'s watch section)."""

COVERS: dict[settings.Strategy, list[RunnerKind]] = {
    "auto": ["idle", "gil", "child", "late"],
    "watchdog": ["idle", "gil", "child", "late"],
    "pidfd": ["idle", "child", "late"],
    "sentinel": ["idle", "child", "late"],
    "poll": ["idle", "child", "late"],
}


@pytest.mark.parametrize("strategy", list(COVERS))
def test_runners_go_while_their_dead_worker_is_still_unreaped(
    start_worker: StartWorker, strategy: settings.Strategy
) -> None:
    if strategy == "pidfd" and not can_use_pidfd():
        pytest.skip(f"no pidfd on the {system.BACKEND} backend")
    worker = start_worker(COVERS[strategy], strategy=strategy)
    everyone = worker.all_processes()
    killed_at = scenarios.kill_worker(worker, reap_after=REAP_AFTER_SECONDS)
    exits = scenarios.wait_gone(everyone, GONE_WITHIN_SECONDS)
    checked_at = time.monotonic()
    # The worker really was a zombie all along: the test would see a reap otherwise.
    assert checked_at - killed_at < REAP_AFTER_SECONDS
    assert psutil.Process(worker.pid).status() == psutil.STATUS_ZOMBIE
    assert all(seen is not None for seen in exits.values()), (strategy, exits)
