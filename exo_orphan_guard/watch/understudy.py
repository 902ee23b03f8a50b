"""The watchdog's understudy: a fork of it that takes over if the watchdog dies.

A watchdog is one process, and processes get killed while the worker lives: by the
OOM killer or jetsam, by a user who takes it for a duplicate runner (it carries the
runner's command line), by runner code that stops its group. Nothing would bound the
runner then, and the runner cannot replace it in time: a thread of its own needs the
GIL, which a runner stuck in native code holds. So each watchdog keeps an understudy:
a fork of itself that only waits for its watchdog's end, as EOF on a pipe whose write
end the watchdog alone holds (no wake-up while both live). If the watchdog goes while
the runner lives, the understudy becomes the watchdog, with the same pipes to the
runner, and keeps an understudy of its own; if the understudy goes, the watchdog forks
another. Both sit in the runner's group, so the watchdog's group kill takes both.

Each is bounded: a watchdog that keeps failing must not fork forever.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable
from typing import Final, NoReturn

from ..system.identity import ProcessIdentity, liveness
from ..system.process_facts import Pid

MAX_UNDERSTUDIES: Final = 8
"""Understudies forked along one line of watchdogs, takeovers and replacements."""

TakeOver = Callable[[Pid, int], NoReturn]
"""Run in an understudy whose watchdog (the pid) died while the runner lived, with the
number of understudies forked so far: it becomes the watchdog."""


def stand_by(runner: ProcessIdentity, take_over: TakeOver, forked: int = 0) -> None:
    """Fork an understudy of this watchdog, and another whenever it dies while the
    runner lives. Returns at once in the watchdog; never returns in an understudy."""
    if forked >= MAX_UNDERSTUDIES:
        return
    child, alive = _fork_understudy(runner, take_over, forked + 1)
    threading.Thread(
        target=_replace_when_gone,
        args=(child, alive, runner, take_over, forked + 1),
        name="exo-orphan-guard-understudy",
        daemon=True,
    ).start()


def _fork_understudy(runner: ProcessIdentity, take_over: TakeOver, forked: int) -> tuple[int, int]:
    """The understudy's pid, and the write end of the pipe it waits on."""
    alive_read, alive_write = os.pipe()
    watchdog = Pid(os.getpid())
    with warnings.catch_warnings():
        # Forked from a threaded process: the child touches no lock the other
        # threads (blocked in syscalls) could hold.
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:
        _understudy_main(alive_read, alive_write, watchdog, runner, take_over, forked)
    os.close(alive_read)
    return child, alive_write


def _understudy_main(
    alive_read: int,
    alive_write: int,
    watchdog: Pid,
    runner: ProcessIdentity,
    take_over: TakeOver,
    forked: int,
) -> NoReturn:
    try:
        os.close(alive_write)
        while os.read(alive_read, 1):
            pass
        os.close(alive_read)
        if liveness(runner) == "gone":
            # The watchdog ended with its runner (it ended it, or the runner left no
            # group to kill): nothing is left to watch.
            os._exit(0)
    except BaseException:
        os._exit(1)
    take_over(watchdog, forked)


def _replace_when_gone(
    child: int, alive: int, runner: ProcessIdentity, take_over: TakeOver, forked: int
) -> None:
    """In the watchdog: wait for its understudy (a child, so waitpid reaps it too)."""
    while forked < MAX_UNDERSTUDIES:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)
        if liveness(runner) == "gone":
            return
        with contextlib.suppress(OSError):
            os.close(alive)
        forked += 1
        child, alive = _fork_understudy(runner, take_over, forked)
