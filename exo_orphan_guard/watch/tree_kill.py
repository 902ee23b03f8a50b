"""SIGKILL a runner and everything it started, once its worker is confirmed dead.

Usually called from inside the runner's own process group (by the runner's watch
thread or by its watchdog), where the group kill ends the caller too.
"""

from __future__ import annotations

import contextlib
import os
import signal

from .. import system
from ..system.identity import ProcessIdentity, identity_of, liveness


def kill_runner_tree(runner: ProcessIdentity, group: int | None) -> None:
    """`group` is the runner's own process group, or None if it could not lead one.

    The group takes the runner and everything that stayed in it with one signal, even
    after the runner is dead and they were reparented. Strays (descendants that left
    the group) are found by one walk of the tree taken before any signal, while every
    parent link still holds: a process whose parent dies is reparented and drops out
    of any later walk. A caller outside the group kills the group first and the strays
    after; a caller inside it must kill the strays first, as the group kill ends it.
    """
    me = os.getpid()
    strays = [
        identity
        for pid in system.descendants(runner.pid)
        if pid != me and (identity := identity_of(pid)) is not None
    ]
    inside = group is not None and _group_of_caller() == group
    if group is not None and not inside:
        _kill_group(group)
    for stray in strays:
        # Checked again: a pid freed by the group kill may have been reused since.
        if liveness(stray) == "alive":
            _kill_quietly(stray.pid)
    if group is None:
        if liveness(runner) == "alive":
            _kill_quietly(runner.pid)
    elif inside:
        _kill_group(group)


def _group_of_caller() -> int:
    return os.getpgrp()


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
