"""Test hook: a runner starts a child that leaves its group right after the walk of
its tree that precedes its kill, as its main thread may while its watch thread kills.

Put on PYTHONPATH (as `sitecustomize`, run by every interpreter at start-up), it acts
only in multiprocessing spawn children (the runners) when EOG_TEST_STRAY_AFTER_WALK
names a file: the child's pid is written there.
"""

from __future__ import annotations

import os
import subprocess
import sys

from exo_orphan_guard.system.identity import ProcessIdentity


def _start_a_stray_after_the_walk(pid_file: str) -> None:
    from exo_orphan_guard.watch import tree_kill

    walk = tree_kill.verified_descendants

    def walk_then_start_a_stray(root: ProcessIdentity) -> list[ProcessIdentity]:
        found = walk(root)
        if root.pid == os.getpid() and not os.path.exists(pid_file):
            stray = subprocess.Popen(["/bin/sleep", "3600"], start_new_session=True)
            with open(pid_file, "w") as file:
                file.write(str(stray.pid))
        return found

    tree_kill.verified_descendants = walk_then_start_a_stray


if "--multiprocessing-fork" in sys.argv and (path := os.environ.get("EOG_TEST_STRAY_AFTER_WALK")):
    _start_a_stray_after_the_walk(path)
