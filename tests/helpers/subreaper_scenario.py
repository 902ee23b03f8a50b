"""Run a worker scenario with this process as a child subreaper (Linux).

Orphans then reparent to this process instead of pid 1, as they do under systemd
--user, tini or a container's init. Prints one JSON line with what happened.

    python subreaper_scenario.py {guard|none} REGISTRY_DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import psutil

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios


def main() -> None:
    watch = sys.argv[1]
    assert watch in ("guard", "none")
    if not system.become_child_subreaper():
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    worker = scenarios.start_worker(
        ["idle", "gil", "child"], watch=watch, registry=Path(sys.argv[2])
    )
    try:
        tracked = worker.all_processes()
        scenarios.kill_worker(worker)
        # Reparenting happens at the worker's death: read the parents right after.
        parents: list[int] = []
        for runner in worker.runners:
            with contextlib.suppress(psutil.Error):
                parents.append(psutil.Process(runner.identity.pid).ppid())
        # Guarded: gone as soon as they go. Unguarded: the time they had to go.
        exits = scenarios.wait_gone(tracked, 10.0 if watch == "guard" else 1.0)
        alive_after = [identity.pid for identity, seen in exits.items() if seen is None]
        print(
            json.dumps(
                {
                    "subreaper": os.getpid(),
                    "orphan_parents": parents,
                    "tracked": len(tracked),
                    "alive_after": alive_after,
                }
            )
        )
    finally:
        scenarios.cleanup(worker)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG) != (0, 0):
                pass


if __name__ == "__main__":
    main()
