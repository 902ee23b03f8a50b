"""SIGKILL a runner and everything it started, once its worker is confirmed dead.

Called from inside the runner's own process group (by the runner's watch thread or by
its watchdog), so the group kill comes last: it ends the caller too.
"""

from __future__ import annotations

import contextlib
import os
import signal

from . import system
from .identity import ProcessIdentity, liveness


def kill_runner_tree(runner: ProcessIdentity, group: int | None) -> None:
    """`group` is the runner's own process group, or None if it could not lead one.

    The group reaches descendants even after the runner itself is dead and they have
    been reparented; the walk first catches any that left the group.
    """
    me = os.getpid()
    for pid in system.descendants(runner.pid):
        if pid != me:
            _kill_quietly(pid)
    if group is None:
        if liveness(runner) == "alive":
            _kill_quietly(runner.pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
