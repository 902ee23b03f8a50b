"""How a stand-in runner is guarded (its `Watch`): by exo's in-tree hooks module, by
the package's watch (`guard_runner`, what `exec` runs), by exo PR 2205's proposal, or
not at all."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .scenario_worker import Watch, WorkerEnd

PR2205_POLL_SECONDS: Final = 5.0


def start_watch(watch: Watch, worker_end: WorkerEnd) -> None:
    match watch:
        case "exo":
            from . import exo_runner

            assert isinstance(worker_end, tuple)
            exo_runner.guard(worker_end[0], worker_end[1])
        case "guard":
            from exo_orphan_guard import guard_runner

            guard_runner(runner_id=f"scenario-{os.getpid()}", instance_id="scenario")
        case "pr2205":
            threading.Thread(target=_pr2205_poll, daemon=True).start()
        case "none":
            pass


def _pr2205_poll() -> None:
    """exo PR 2205's proposal: poll getppid() every 5 s, exit when it changes."""
    original = os.getppid()
    while True:
        time.sleep(PR2205_POLL_SECONDS)
        if os.getppid() != original:
            os._exit(1)
