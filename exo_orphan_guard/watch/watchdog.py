"""A forked helper process per runner: the part of the watch that needs no GIL.

A runner stuck in native code holding the GIL (MLX's `mx.distributed.init()` does
this) cannot run any Python thread of its own. The watchdog is a separate process, so
it can wait on the worker and end the runner whatever the runner is doing.

When the worker dies it notices the runner (`NOTICE_SIGNAL`, and a byte that wakes
the runner's heartbeat thread) and bounds its clean ending. A runner whose main thread
has not begun it is busy in native code: it is waited for until the busy wait
(`EXO_ORPHAN_GUARD_BUSY_WAIT`, from the notice) and recorded as busy, with the GIL
held or free (heartbeats from the runner, or none). Once begun, the ending has the
grace; outside `ending_cleanly()` the notice is repeated every second, so that a
swallowed `WorkerGone` comes again. A runner still busy at the busy wait, or not
exited within its grace, is killed with its group; one that exits in time ended
cleanly. Each ending is recorded (`records.endings`). With no clean ending (grace 0)
it kills the group at once, as the only way; on any error of its own, it kills the
group if the worker is gone, and records why.

It is forked, not spawned: no interpreter start-up, nothing to find on disk, and it
works the same in exo's frozen (PyInstaller) app, which cannot run `python -c`. It is
forked before the runner starts any thread of its own and touches nothing but
syscalls, so it takes no lock another thread could have held. It never outlives the
runner (a thread waits on it) nor the worker (it kills the runner's group, which
includes itself, once the runner is gone or killed).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import select
import signal
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NoReturn, final

from .. import system
from ..system.identity import ProcessIdentity, liveness
from ..system.process_facts import Pid
from ..system.settings import WEDGE_SECONDS, busy_bound
from . import notice_check, understudy
from .clean_ending import (
    AGAIN_SECONDS,
    BEGUN,
    HEARTBEAT,
    HEARTBEAT_SECONDS,
    NOTICE,
    NOTICE_SIGNAL,
    RAISED,
    SHELTER_LEFT,
    SHUTTING_DOWN,
    TOOK_OVER,
)
from .ending_plan import EndingPlan, Gil, Outcome, described, record, record_begun
from .tree_kill import KnownTree, kill_runner_tree, signal_verified
from .waiters import WaiterName, confirmed_gone, wait_for_exit

_BEGUN_FD: Final = 3
"""Where the watchdog keeps the read end of the runner's `begun` pipe."""
_NOTICE_FD: Final = 4
"""Where it keeps the write end of the pipe that wakes the runner's heartbeat."""
_CHECK_SECONDS: Final = 0.05
_WALK_SECONDS: Final = 0.1
"""How often the runner's tree is walked while it ends (what it starts meanwhile)."""
_SILENCE_SECONDS: Final = 3.5 * HEARTBEAT_SECONDS
"""No heartbeat for this long: the runner's main thread holds the GIL."""

_MAX_BUSY_LINES: Final = 8
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def start_watchdog(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
    plan: EndingPlan,
) -> Pid:
    """Fork the watchdog and return its pid (OSError if fork fails)."""
    with warnings.catch_warnings():
        # Python >= 3.12 warns about fork in a threaded process; the child below
        # never touches a lock, so the warning does not apply to it.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _watchdog_main(worker, runner, group, chain, record_path, plan)
    return Pid(pid)


def _watchdog_main(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
    plan: EndingPlan,
    taking_over: _TakeOver | None = None,
) -> NoReturn:
    """`taking_over`: in an understudy whose watchdog died, what it takes over (its
    files are detached already)."""
    exit_code = 0
    try:
        if taking_over is None:
            # Objects copied from the runner must not be finalised here: one could
            # close an fd number that our own pidfd has since taken.
            gc.disable()
            begun, notice = _detach_inherited_files(plan.begun, plan.notice)
            # A stop signal meant for the runner's group (its own code stopping its
            # children) or for a "duplicate runner" must not leave it unbounded.
            for stop in _STOP_SIGNALS:
                signal.signal(stop, signal.SIG_IGN)
            forked = 0
        else:
            begun, notice, forked = taking_over.begun, taking_over.notice, taking_over.forked
            _took_over(plan, runner, notice, taking_over.watchdog)

        def take_over(watchdog: Pid, forked: int) -> NoReturn:
            _watchdog_main(
                worker,
                runner,
                group,
                chain,
                record_path,
                plan,
                _TakeOver(begun, notice, watchdog, forked),
            )

        understudy.stand_by(runner, take_over, forked)
        # The runner may be gone already (this process can first run long after the
        # fork). Then the thread below finds it gone at once and, as a member of its
        # group (so the group id cannot have been reused), kills what it left there.
        threading.Thread(
            target=_exit_with_runner,
            args=(worker, runner, group, chain, record_path),
            name="exo-orphan-guard-runner-wait",
            daemon=True,
        ).start()
        wait_for_exit(worker, chain)
        noticed = time.monotonic()
        # Walked now, before the runner hears of it, and as it ends: what it started
        # outside its group must be known before it exits (see KnownTree).
        tree = KnownTree(runner, _WALK_SECONDS)
        tree.walk(noticed)
        if begun is None:
            # Even if PR_SET_PDEATHSIG took the runner first: its group still holds
            # whatever the runner started, and this process keeps the group id from reuse.
            record(plan, runner, "killed", 0.0, plan.why_no_clean_ending, step="at_once")
        else:
            # The runner may have no thread to tell it. It may also be dead already,
            # its pid free for a stranger: the signal goes only to the runner.
            signal_verified(runner, NOTICE_SIGNAL)
            if notice is not None:
                with contextlib.suppress(OSError):
                    os.write(notice, NOTICE)
            outcome, gil, found, raised = _await_the_ending(runner, begun, noticed, plan, tree)
            after = time.monotonic() - noticed
            how, after, why, step = described(outcome, after, gil, plan.grace, raised)
            why += notice_check.said(found, NOTICE_SIGNAL)
            record(plan, runner, how, after, why, step=step)
        kill_runner_tree(runner, group, tree.known)
    except BaseException as error:
        exit_code = 1
        _end_after_a_failure(worker, runner, group, plan, error)
    finally:
        os._exit(exit_code)


@final
@dataclass(frozen=True, slots=True)
class _TakeOver:
    begun: int | None
    notice: int | None
    watchdog: Pid
    """The watchdog that died."""
    forked: int
    """Understudies forked so far."""


def _took_over(plan: EndingPlan, runner: ProcessIdentity, notice: int | None, dead: Pid) -> None:
    """Say so: to the runner (it logs it, and repeats that its ending has begun, if it
    has), and in the endings log."""
    if notice is not None:
        with contextlib.suppress(OSError):
            os.write(notice, TOOK_OVER)
    why = f"its watchdog {dead} died while it lived; {os.getpid()} took over"
    record(plan, runner, None, None, why, event="watchdog")


def _end_after_a_failure(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    plan: EndingPlan,
    error: BaseException,
) -> None:
    """The watchdog failed: if the worker is gone, nothing else bounds the runner (it
    may hold the GIL), so its group is killed, and why is recorded."""
    with contextlib.suppress(BaseException):
        if liveness(worker) != "gone" or liveness(runner) == "gone":
            return
        why = f"its watchdog failed ({type(error).__name__}: {error}) after its worker died"
        record(plan, runner, "killed", None, why)
        kill_runner_tree(runner, group)


@final
class _Watched:
    """What the watchdog has learnt of the runner since the notice."""

    def __init__(self, noticed: float) -> None:
        self.noticed = noticed
        self.begun_at: float | None = None
        self.sheltered = False
        self.shutting_down = False
        self.beats: list[float] = []
        """When the last heartbeats came (a few)."""
        self.last_notice = noticed
        self.recorded_gil: Gil | None = None
        self.busy_lines = 0
        self.notice_found = b""
        """What stood in the notice's way (`notice_check`)."""
        self.raised = False
        """`WorkerGone` was raised on the runner's main thread."""

    def learn(self, data: bytes, now: float) -> None:
        for byte in data:
            news = bytes((byte,))
            if news == HEARTBEAT:
                self.beats = [*self.beats[-2:], now]
            elif news == BEGUN and self.begun_at is None:
                self.begun_at = now
            elif news == SHUTTING_DOWN:
                self.sheltered = self.shutting_down = True
            elif news == SHELTER_LEFT:
                self.sheltered = False
                self.last_notice = now  # its own shutdown done: a second before the next
            elif news == RAISED:
                self.raised = True
            elif news in notice_check.NEWS and news not in self.notice_found:
                self.notice_found += news

    def gil(self, now: float) -> Gil:
        """Free while heartbeats keep coming: two within the silence bound. One alone is
        the thread slipping in as the main thread comes back to Python (its handler's
        first bytecodes let the GIL go), which says nothing of the call."""
        recent = [beat for beat in self.beats if now - beat < _SILENCE_SECONDS]
        return "free" if len(recent) >= 2 else "held"


def _await_the_ending(
    runner: ProcessIdentity, begun: int, noticed: float, plan: EndingPlan, tree: KnownTree
) -> tuple[Outcome, Gil, bytes, bool]:
    """Wait for the runner to begin (a byte) within the busy wait and to exit (EOF, or
    gone) within the grace from then; repeat the notice while it has not exited, and
    walk its tree every `_WALK_SECONDS`. Also answers what stood in the notice's way, and
    whether `WorkerGone` was raised."""
    watched = _Watched(noticed)
    bound = busy_bound(plan.busy_wait)
    while True:
        now = time.monotonic()
        begun_at = watched.begun_at
        deadline = noticed + bound if begun_at is None else begun_at + plan.grace
        if now >= deadline:
            outcome = "busy" if begun_at is None else "hanging"
            return outcome, watched.gil(now), watched.notice_found, watched.raised
        readable, _, _ = select.select([begun], [], [], min(deadline - now, _CHECK_SECONDS))
        data = os.read(begun, 4096) if readable else None
        if data == b"" or liveness(runner) == "gone":
            if data:  # what it said before it exited counts too
                watched.learn(data, now)
            outcome = "shut down" if watched.shutting_down else "clean"
            return outcome, watched.gil(now), watched.notice_found, watched.raised
        now = time.monotonic()
        tree.walk(now)
        if data:
            watched.learn(data, now)
            if begun_at is None and watched.begun_at is not None:
                record_begun(plan, runner, watched.begun_at + plan.grace)
        if watched.begun_at is None:
            _note_busy(plan, runner, watched, now, bound)
        elif not watched.sheltered and now - watched.last_notice >= AGAIN_SECONDS:
            watched.last_notice = now  # a WorkerGone swallowed by a bare `except:` comes again
            signal_verified(runner, NOTICE_SIGNAL)


def _note_busy(
    plan: EndingPlan, runner: ProcessIdentity, watched: _Watched, now: float, bound: float
) -> None:
    """Past `WEDGE_SECONDS` without a beginning: a `busy` line, again if the GIL state
    changes (a few times at most: a call that flaps must not flood the log). Its
    deadline is the latest a sweep need wait: the busy wait, then the grace."""
    if now - watched.noticed < WEDGE_SECONDS or bound <= WEDGE_SECONDS:
        return
    gil = watched.gil(now)
    if gil == watched.recorded_gil or watched.busy_lines >= _MAX_BUSY_LINES:
        return
    watched.recorded_gil = gil
    watched.busy_lines += 1
    why = f"busy in native code, GIL {gil}" + notice_check.said(watched.notice_found, NOTICE_SIGNAL)
    deadline = watched.noticed + bound + plan.grace
    at = time.time() - (now - watched.noticed)
    record(
        plan,
        runner,
        None,
        None,
        why,
        event="busy",
        deadline=deadline,
        at=at,
        gil=gil,
        busy_wait=bound,
    )


def _exit_with_runner(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
) -> None:
    wait_for_exit(runner, chain)
    if confirmed_gone(worker):
        return  # the worker went first: the main thread records how the runner ended
    if record_path is not None:
        # The runner died while its worker lives (exo stopped or killed it): its
        # record is stale.
        with contextlib.suppress(OSError):
            os.unlink(record_path)
    # Whatever took the runner (exo's own stop, Ctrl-C's SIGINT reaching only the
    # worker's group), what it started dies with it, as it would have by the
    # terminal's signal before the runner left the worker's group. The group kill
    # ends this process too.
    try:
        kill_runner_tree(runner, group)
    except BaseException:
        # A failed walk must not leave this process (and the group) behind. While it
        # is a member, the group id cannot have been reused: a bare group kill is safe.
        if group is not None and os.getpgrp() == group:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
    os._exit(0)


def _detach_inherited_files(begun: int | None, notice: int | None) -> tuple[int | None, int | None]:
    """Hold none of the runner's pipes (exo waits for EOF on its stdout and stderr),
    but the read end of the `begun` pipe, moved to `_BEGUN_FD`, and the write end of
    the notice pipe, moved to `_NOTICE_FD`."""
    if begun is None:
        notice = None
    elif notice is not None:
        # Both out of the way first: either may sit where the other is to go.
        begun = fcntl.fcntl(begun, fcntl.F_DUPFD, _NOTICE_FD + 1)
        notice = fcntl.fcntl(notice, fcntl.F_DUPFD, _NOTICE_FD + 1)
        os.dup2(notice, _NOTICE_FD)
        notice = _NOTICE_FD
    if begun is not None and begun != _BEGUN_FD:
        os.dup2(begun, _BEGUN_FD)
        begun = _BEGUN_FD
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    kept = _BEGUN_FD if begun is None else _NOTICE_FD if notice is None else _NOTICE_FD + 1
    system.close_inherited_files(kept)
    for fd in (begun, notice):
        if fd is not None:
            os.set_inheritable(fd, False)
    return begun, notice
