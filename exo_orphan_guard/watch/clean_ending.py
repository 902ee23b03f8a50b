"""The clean ending: a runner whose worker died ends on its own main thread.

Every notice of the worker's death (the watch thread's `pthread_kill`, the kernel's
PR_SET_PDEATHSIG, the watchdog's signal: whichever comes first) is `NOTICE_SIGNAL`,
and its handler runs on the main thread, between two bytecodes: where the guarded
program's code runs. It checks that the worker really is gone, tells the watchdog the ending has
begun (a byte on a pipe), makes the process able to end with nobody reading what it
writes, and raises `WorkerGone` there. A program that catches it runs its own shutdown;
one that catches nothing unwinds. The watchdog gives it the grace, and kills it
only after that.

A main thread in native code runs the handler only once the call returns: it is
busy, not wedged, and is waited for (`EXO_ORPHAN_GUARD_BUSY_WAIT`). Meanwhile a small
thread, woken by the watchdog's notice, beats on the same pipe: it can run only while
the call lets go of the GIL, so its silence tells the watchdog the GIL is held.

`WorkerGone` is not lost to a bare `except:`: until the runner exits it is raised
again, at most once a second, except inside `ending_cleanly()`, whose clean-up is
never interrupted (the watchdog repeats the notice only outside it, and the handler
checks again).

While the worker lives nothing here changes what a signal does: SIGTERM keeps its
default action. (exo's runners are not guarded here: exo's own hooks module hands
them their Shutdown when their worker dies.)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Generator
from types import FrameType
from typing import Final, Literal, final

from loguru import logger

from ..system.identity import ProcessIdentity
from . import ending_exit, notice_check, widowed
from .waiters import confirmed_gone
from .worker_gone import WorkerGone

NOTICE_SIGNAL: Final = signal.SIGUSR1
BEGUN: Final = b"b"
"""On the pipe to the watchdog: the main thread has begun the clean ending."""
SHUTTING_DOWN: Final = b"s"
"""On the pipe to the watchdog: the ending runs the program's own shutdown (inside
`ending_cleanly()`), which nothing interrupts."""
SHELTER_LEFT: Final = b"u"
"""On the pipe to the watchdog: the program's own shutdown is over; repeat the notice."""
HEARTBEAT: Final = b"h"
"""On the pipe to the watchdog: a thread of the runner ran, so its main thread, not
yet back in Python, does not hold the GIL."""
NOTICE: Final = b"n"
"""On the pipe from the watchdog: the worker is gone."""
TOOK_OVER: Final = b"w"
"""On the pipe from the watchdog: it took over from a watchdog that died."""
RAISED: Final = b"r"
"""On the pipe to the watchdog: `WorkerGone` was raised on the main thread."""
HEARTBEAT_SECONDS: Final = 0.1
AGAIN_SECONDS: Final = 1.0
"""`WorkerGone` is raised again at most this often."""

Phase = Literal["watching", "ending"]


@final
class _State:
    def __init__(
        self,
        me: ProcessIdentity,
        worker: ProcessIdentity,
        begun: int,
        grace: float,
    ):
        self.me = me
        self.worker = worker
        self.begun = begun
        self.grace = grace
        self.raised = False
        self.phase: Phase = "watching"
        self.sheltered = 0
        self.last_raised = 0.0
        """`time.monotonic()` of the last WorkerGone, or of the end of the last shelter."""
        self.prepared = False
        """The first notice's handler has done all it does (a repeat may interrupt
        nothing of it)."""
        self.entered = 0.0
        self.begun_at: float | None = None
        """`time.monotonic()` when the main thread began the ending (in Python)."""
        """`time.monotonic()` when the main thread last entered the handler."""
        self.messages: list[str] = []
        """What the handler hands the logging thread to log."""
        self.log_wake = -1
        self.armed: notice_check.Armed | None = None
        """The notice signal as `install` armed it."""


_state: _State | None = None


def install(
    me: ProcessIdentity,
    worker: ProcessIdentity,
    begun: int,
    grace: float,
    notice: int,
) -> None:
    """Arm the handler (main thread only: Python's rule for signal handlers). `begun`:
    the write end of the pipe whose other end the watchdog reads; `notice`: the read end
    of the pipe the watchdog writes a byte to when the worker is gone (EOF: it is gone)."""
    global _state
    os.set_blocking(begun, False)
    state = _State(me, worker, begun, grace)
    _state = state
    wake, state.log_wake = os.pipe()
    os.set_blocking(state.log_wake, False)
    threading.Thread(
        target=_log_what_the_handler_hands,
        args=(state, wake),
        name="exo-orphan-guard-log",
        daemon=True,
    ).start()
    atexit.register(_log_pending, state)
    signal.signal(NOTICE_SIGNAL, _on_notice)
    state.armed = notice_check.arm(NOTICE_SIGNAL, _on_notice)
    threading.Thread(
        target=_listen_to_the_watchdog,
        args=(state, notice),
        name="exo-orphan-guard-heartbeat",
        daemon=True,
    ).start()


def notice_main_thread() -> None:
    """From any thread: deliver the notice to the main thread itself, so that whatever
    it is blocked in (a queue, a lock, a sleep) returns and the handler runs."""
    main = threading.main_thread().ident
    if main is not None:
        with contextlib.suppress(ProcessLookupError):
            signal.pthread_kill(main, NOTICE_SIGNAL)


@contextlib.contextmanager
def ending_cleanly() -> Generator[None]:
    """Mark code that is already ending the runner the clean way (its own shutdown):
    a worker's death inside it does not interrupt it, and the runner keeps its grace
    to finish and exit. A no-op in an unguarded process."""
    state = _state
    if state is None:
        yield
        return
    state.sheltered += 1
    if state.phase == "ending" and state.sheltered == 1:
        _tell_watchdog(state, SHUTTING_DOWN)
    try:
        yield
    finally:
        state.sheltered -= 1
        if state.phase == "ending" and state.sheltered == 0:
            state.last_raised = time.monotonic()
            _tell_watchdog(state, SHELTER_LEFT)


def _on_notice(signal_number: int, frame: FrameType | None) -> None:
    del signal_number, frame
    state = _state
    if state is None:
        return
    # Back in Python: no more heartbeats (what follows may let other threads run, which
    # says nothing of the native call that has returned).
    state.entered = time.monotonic()
    if state.phase == "ending":
        _raise_again(state)
        return
    # A thread of the worker that exits also fires PR_SET_PDEATHSIG; so does a stray
    # SIGUSR1: only a worker confirmed gone ends the runner.
    if not confirmed_gone(state.worker):
        return
    # Notices that come together (PR_SET_PDEATHSIG, the watch thread, the watchdog)
    # run this handler again inside itself: from here on they start nothing more, and
    # the first WorkerGone is still a second away from any repeat.
    state.phase = "ending"
    state.last_raised = state.begun_at = time.monotonic()
    sheltered = state.sheltered > 0
    _tell_watchdog(state, BEGUN + (SHUTTING_DOWN if sheltered else b""))
    widowed.until_every_thread_is_gone(state.worker)
    _prepare_to_end(state.me, state.worker)
    # No loguru call here: the interrupted code may hold a sink's lock. The message
    # goes to a thread that logs it (a list append and a pipe write take no lock).
    exiting = _exit_under_way()
    _log_later(
        state,
        f"orphan guard: runner {state.me.pid}: its worker {state.worker.pid} died: "
        + (
            "finishing its shutdown"
            if sheltered
            else "letting its exit finish"
            if exiting
            else "ending the clean way"
        )
        + f", killed if it has not exited within {state.grace:g} s",
    )
    state.last_raised = time.monotonic()
    state.prepared = True
    if not sheltered and not exiting:
        _raise(state, f"worker {state.worker.pid} is gone")


def _raise(state: _State, message: str) -> None:
    if not state.raised:
        state.raised = True
        _tell_watchdog(state, RAISED)
    raise WorkerGone(message)


def _exit_under_way() -> bool:
    """The main thread is done (the interpreter's exit, atexit, joins of non-daemon
    threads, is under way): a WorkerGone would cut that clean-up short."""
    return sys.is_finalizing() or not threading.main_thread().is_alive()


def _log_later(state: _State, message: str) -> None:
    state.messages.append(message)
    _tell(state.log_wake, b"m")


def _tell(fd: int, news: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, news)


def _log_what_the_handler_hands(state: _State, wake: int) -> None:
    """Log, from a thread of its own, what the notice handler may not log itself."""
    while True:
        try:
            if not os.read(wake, 1):
                return
        except OSError:
            return
        _log_pending(state)


def _log_pending(state: _State) -> None:
    """Also run at exit: a runner that exits right after the notice still says why."""
    while True:
        try:
            message = state.messages.pop(0)
        except IndexError:
            return
        logger.warning(message)


def _raise_again(state: _State) -> None:
    """A repeated notice: the first WorkerGone may have been swallowed (a bare
    `except:`). Never inside `ending_cleanly()`, never once the main thread is done
    (the interpreter's own exit is under way), never twice within `AGAIN_SECONDS`."""
    if not state.prepared or state.sheltered > 0 or _exit_under_way():
        return
    now = time.monotonic()
    if now - state.last_raised < AGAIN_SECONDS:
        return
    state.last_raised = now
    again = " (again: the runner has not exited)" if state.raised else ""
    _raise(state, f"worker {state.worker.pid} is gone{again}")


def _listen_to_the_watchdog(state: _State, notice: int) -> None:
    """Blocked in `read` until the watchdog has news: no wake-up while the worker
    lives. The notice: beat until the main thread begins the ending. A watchdog that
    took over from one that died: say so, and tell it what it missed. EOF: no watchdog
    is left (an understudy takes over from a watchdog that dies, so both died)."""
    while True:
        try:
            news = os.read(notice, 1)
        except OSError:
            return
        if news == TOOK_OVER:
            _another_watchdog(state)
        elif news:
            # The worker is gone: its log sinks drop writes now, not once the main
            # thread is back in Python (another thread may be logging meanwhile).
            widowed.stop_widowed_log_queues(state.worker)
            _beat_until_begun(state)
        else:
            logger.warning(
                f"orphan guard: runner {state.me.pid}: its watchdog and its understudy "
                "are gone: nothing outside this process bounds its ending"
            )
            return


def _beat_until_begun(state: _State) -> None:
    woken = time.monotonic()
    # The notice signal may have been taken over or blocked: see that the notice gets
    # through, and tell the watchdog what stood in its way.
    notice_check.reach(
        state.armed,
        deliver=notice_main_thread,
        tell=lambda news: _tell_watchdog(state, news),
        entered=lambda: state.entered,
        beat=lambda: _tell_watchdog(state, HEARTBEAT),
    )
    while state.entered < woken and state.phase != "ending":
        _tell_watchdog(state, HEARTBEAT)
        time.sleep(HEARTBEAT_SECONDS)


def _another_watchdog(state: _State) -> None:
    told = b""
    if state.phase == "ending":
        sheltered = state.sheltered > 0
        told += BEGUN + (SHUTTING_DOWN if sheltered else b"")
    if state.raised:
        told += RAISED
    _tell_watchdog(state, told)
    if confirmed_gone(state.worker):
        widowed.stop_widowed_log_queues(state.worker)  # the line below must not block
    logger.warning(
        f"orphan guard: runner {state.me.pid}: its watchdog died; its understudy took "
        "over (the busy wait and the grace hold as before)"
    )


def _tell_watchdog(state: _State, news: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(state.begun, news)


def _prepare_to_end(me: ProcessIdentity, worker: ProcessIdentity) -> None:
    ending_exit.prepare(me, worker)
    # From now on a sweep's SIGTERM asks for what is already under way.
    signal.signal(signal.SIGTERM, ending_exit.already_ending)
