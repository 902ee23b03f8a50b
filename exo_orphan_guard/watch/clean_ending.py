"""The clean ending: a runner whose worker died ends on its own main thread.

Every notice of the worker's death (the watch thread's `pthread_kill`, the kernel's
PR_SET_PDEATHSIG, the watchdog's signal: whichever comes first) is `NOTICE_SIGNAL`,
and its handler runs on the main thread, between two bytecodes: where exo's code
runs. It checks that the worker really is gone, tells the watchdog the ending has
begun (a byte on a pipe), makes the process able to end with nobody reading what it
writes, and raises `WorkerGone` there. Exo catches it and runs its own shutdown; a
program that catches nothing unwinds. The watchdog gives it the grace, and kills it
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
default action (exo's own stop of a runner stuck in native code must still end it).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Generator
from types import FrameType
from typing import Final, Literal, final

from loguru import logger

from .. import system
from ..system.identity import ProcessIdentity
from . import notice_check
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
HEARTBEAT_SECONDS: Final = 0.1
AGAIN_SECONDS: Final = 1.0
"""`WorkerGone` is raised again at most this often."""
_WIDOWED: Final = select.POLLERR | select.POLLHUP
_BEFORE_QUEUE_JOINS: Final = 100
_THREADS_GONE_SECONDS: Final = 0.1

Phase = Literal["watching", "ending"]


@final
class _State:
    def __init__(self, me: ProcessIdentity, worker: ProcessIdentity, begun: int, grace: float):
        self.me = me
        self.worker = worker
        self.begun = begun
        self.grace = grace
        self.phase: Phase = "watching"
        self.sheltered = 0
        self.last_raised = 0.0
        """`time.monotonic()` of the last WorkerGone, or of the end of the last shelter."""
        self.prepared = False
        """The first notice's handler has done all it does (a repeat may interrupt
        nothing of it)."""
        self.entered = 0.0
        """`time.monotonic()` when the main thread last entered the handler."""
        self.messages: list[str] = []
        """What the handler hands the logging thread to log."""
        self.log_wake = -1
        self.armed: notice_check.Armed | None = None
        """The notice signal as `install` armed it."""


_state: _State | None = None


def install(
    me: ProcessIdentity, worker: ProcessIdentity, begun: int, grace: float, notice: int
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
        target=_beat_after_the_notice,
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
    """Mark code that is already ending the runner the clean way (exo's own Shutdown):
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


def release_memory() -> None:
    """What the guard does last before a clean exit: collect, and hand MLX's cached
    buffers back (a no-op unless MLX is loaded)."""
    gc.collect()
    mlx = sys.modules.get("mlx.core")
    clear_cache = getattr(mlx, "clear_cache", None)
    if callable(clear_cache):
        with contextlib.suppress(Exception):
            clear_cache()


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
    state.last_raised = time.monotonic()
    sheltered = state.sheltered > 0
    _tell_watchdog(state, BEGUN + (SHUTTING_DOWN if sheltered else b""))
    _until_every_thread_is_gone(state.worker)
    _prepare_to_end(state.worker)
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
        raise WorkerGone(f"worker {state.worker.pid} is gone")


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
    raise WorkerGone(f"worker {state.worker.pid} is gone (again: the runner has not exited)")


def _beat_after_the_notice(state: _State, notice: int) -> None:
    """Once the watchdog's notice comes, beat until the main thread begins the ending.
    Blocked in `read` until then: no wake-up while the worker lives."""
    try:
        if not os.read(notice, 1):
            return  # the watchdog is gone: nothing to tell
    except OSError:
        return
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


def _tell_watchdog(state: _State, news: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(state.begun, news)


def _prepare_to_end(worker: ProcessIdentity) -> None:
    """Nothing the dead worker held may stop the ending half-way."""
    _silence_widowed_output()
    _stop_widowed_log_queues(worker)
    _skip_queue_joins()
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        # Again at exit, before multiprocessing's own joins (priority -5): a queue first
        # used during the ending has its feeder thread, and its join, only from then.
        util.Finalize(None, _skip_queue_joins, exitpriority=_BEFORE_QUEUE_JOINS)
    # From now on a sweep's SIGTERM asks for what is already under way.
    signal.signal(signal.SIGTERM, _already_ending)
    atexit.register(release_memory)


def _already_ending(signal_number: int, frame: FrameType | None) -> None:
    del signal_number, frame


def _silence_widowed_output() -> None:
    """stdout/stderr on a pipe that only the dead worker read (exo main's runners): a
    write there fails with EPIPE. They go to /dev/null instead; a pipe someone still
    reads (`exo | tee log`), a file or a terminal is left alone."""
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)) or not _widowed(fd):
            continue
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)


def _stop_widowed_log_queues(worker: ProcessIdentity) -> None:
    """loguru's sinks added with `enqueue=True` (exo's `logger_setup`) write into a pipe
    read by a thread of the process that added them: the dead worker. The runner holds
    that pipe's read end too (pickled with the logger), so a write never fails: it
    blocks for good once the pipe is full. From now on such handlers drop what they are
    given (nobody would read it); the runner's own sinks, and queues whose reader
    lives, are left alone. The class is patched, not the handlers: the runner's logger
    is an unpickled copy, out of reach of `loguru.logger`."""
    handler_class: object = getattr(sys.modules.get("loguru._handler"), "Handler", None)
    emit: object = getattr(handler_class, "emit", None)
    if not isinstance(handler_class, type) or not callable(emit):
        return
    if getattr(emit, "_orphan_guard_widowed", False):
        return
    widowed: dict[int, bool] = {worker.pid: True, os.getpid(): False}

    def emit_unless_widowed(self: object, *args: object, **kwargs: object) -> object:
        owner = getattr(self, "_owner_process_pid", None)
        if getattr(self, "_enqueue", False) is True and isinstance(owner, int):
            if owner not in widowed:
                widowed[owner] = not _pid_exists(owner)
            if widowed[owner]:
                return None
        return emit(self, *args, **kwargs)

    emit_unless_widowed._orphan_guard_widowed = True  # pyright: ignore[reportFunctionMemberAccess]
    with contextlib.suppress(AttributeError, TypeError):
        handler_class.emit = emit_unless_widowed  # pyright: ignore[reportAttributeAccessIssue]


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _widowed(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, 0)  # no events asked: poll reports only ERR and HUP
    return any(events & _WIDOWED for _, events in poller.poll(0))


def _until_every_thread_is_gone(worker: ProcessIdentity) -> None:
    """PR_SET_PDEATHSIG comes as the worker's main thread exits; its other threads go
    a moment later, and only the last one closes the worker's files (its pipes).
    Linux counts a zombie's threads until each is gone; elsewhere the count is not
    there once the process has exited, so nothing is waited for."""
    deadline = time.monotonic() + _THREADS_GONE_SECONDS
    while time.monotonic() < deadline:
        threads = system.thread_count(worker.pid)
        if threads is None or threads <= 1:
            return
        time.sleep(0.002)


def _skip_queue_joins() -> None:
    """At exit, multiprocessing joins each queue's feeder thread, which blocks for good
    on a full pipe the dead worker no longer reads: cancel those joins, as
    `Queue.cancel_join_thread()` does, for every queue in the process (exo's channels
    and loguru's are the runner's, not ours to hold)."""
    queues = sys.modules.get("multiprocessing.queues")
    util = sys.modules.get("multiprocessing.util")
    if queues is None or util is None:
        return
    join = queues.Queue._finalize_join  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    registry: dict[object, object] = util._finalizer_registry  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    for finalizer in list(registry.values()):
        if getattr(finalizer, "_callback", None) is join:
            cancel = getattr(finalizer, "cancel", None)
            if callable(cancel):
                cancel()
