"""The exec wrapper's keeper: the one process beside it that ends the command's tree
when the wrapper cannot.

The wrapper stops its command itself when its launcher dies: its main thread runs
nothing but its own short Python, so its thread that waits on the launcher wakes it
within milliseconds. What it cannot do is act once it is SIGKILLed (the OOM killer,
a `kill -9`). The keeper, a fork of the wrapper, waits for the wrapper's exit and
then kills what is left of the command's tree and of the wrapper's process group; if
the launcher dies and the wrapper is still there past its grace and a margin (stopped,
say), it kills them then, and records it.

One process, not two. A runner's watchdog keeps an understudy because a runner
holding the GIL in native code cannot replace a watchdog that dies; the wrapper's
main thread never holds it for long, so the wrapper forks another keeper itself
(`exec_wrapper`). The keeper touches nothing but syscalls and what it was handed,
ignores the signals a group gets (a terminal's Ctrl-C, a launcher's `kill`), and
never outlives the wrapper.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, NoReturn, final

from .. import system
from ..system.identity import ProcessIdentity, liveness
from ..system.process_facts import Pid
from .ending_plan import EndingPlan, record
from .tree_kill import kill_runner_tree
from .waiters import usable_waiters, wait_for_exit

MARGIN_SECONDS: Final = 1.0
"""The keeper waits this much longer than the grace, so that the wrapper's own SIGKILL
to a command that hangs, not the keeper's group kill, ends it."""
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@final
@dataclass(frozen=True, slots=True)
class Kept:
    """What the keeper keeps, as the wrapper hands it over."""

    wrapper: ProcessIdentity
    launcher: ProcessIdentity | None
    """The wrapper's parent; None when it is init (nothing to wait on)."""
    command: ProcessIdentity | None
    group: int | None
    """The process group the wrapper leads, or None."""
    grace: float
    endings_path: str | None
    boot_id: str
    labels: Mapping[str, str] = field(default_factory=dict[str, str])


def start_keeper(kept: Kept) -> Pid:
    """Fork the keeper and return its pid (OSError if fork fails)."""
    with warnings.catch_warnings():
        # Python >= 3.12 warns about fork in a threaded process (a wrapper replacing
        # its keeper has its launcher's waiter): the child takes no lock it could hold.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _keeper_main(kept)
    return Pid(pid)


def _keeper_main(kept: Kept) -> NoReturn:
    exit_code = 0
    try:
        gc.disable()  # objects copied from the wrapper are never finalised here
        # The wrapper's wake-up pipe is closed below: its fd number may be reused.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _detach_inherited_files()
        for stop in _STOP_SIGNALS:
            signal.signal(stop, signal.SIG_IGN)
        wrapper_gone, either = threading.Event(), threading.Event()
        _set_once_gone(kept.wrapper, wrapper_gone, either)
        if kept.launcher is not None:
            _set_once_gone(kept.launcher, either)
        either.wait()
        # The launcher died first: the wrapper has its grace, and a margin.
        if not wrapper_gone.is_set() and not wrapper_gone.wait(kept.grace + MARGIN_SECONDS):
            _record_the_kill(kept)
        known = () if kept.command is None else (kept.command,)
        kill_runner_tree(kept.wrapper, kept.group, known)
    except BaseException:
        exit_code = 1
        with contextlib.suppress(BaseException):
            if liveness(kept.wrapper) == "gone":
                kill_runner_tree(kept.wrapper, kept.group)
    finally:
        os._exit(exit_code)


def _set_once_gone(target: ProcessIdentity, *events: threading.Event) -> None:
    def wait() -> None:
        # A forked process inherits no multiprocessing sentinel it could trust.
        wait_for_exit(target, tuple(name for name in usable_waiters(target) if name != "sentinel"))
        for event in events:
            event.set()

    threading.Thread(target=wait, name="exo-orphan-guard-keeper-wait", daemon=True).start()


def _record_the_kill(kept: Kept) -> None:
    plan = EndingPlan(
        grace=kept.grace,
        begun=None,
        endings_path=kept.endings_path,
        boot_id=kept.boot_id,
        by="exec",
        labels=kept.labels,
    )
    why = (
        f"the wrapper was still there {kept.grace + MARGIN_SECONDS:g} s after its launcher "
        "died (its grace and a margin): its keeper killed it with the command's tree"
    )
    record(plan, kept.wrapper, "killed", kept.grace + MARGIN_SECONDS, why, step="grace")


def _detach_inherited_files() -> None:
    """Hold none of the wrapper's files: not the rank's stdout or stderr (whoever
    reads them waits for EOF), nor the launcher's stdin pipe."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    system.close_inherited_files(3)
