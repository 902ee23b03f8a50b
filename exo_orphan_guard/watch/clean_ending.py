"""The clean ending: a runner whose worker died ends on its own main thread.

Every notice of the worker's death (the watch thread's `pthread_kill`, the kernel's
PR_SET_PDEATHSIG, the watchdog's signal: whichever comes first) is `NOTICE_SIGNAL`,
and its handler runs on the main thread, between two bytecodes: where exo's code
runs. It checks that the worker really is gone, tells the watchdog the ending has
begun (a byte on a pipe: a main thread that can run this is not wedged), makes the
process able to end with nobody reading its output, and raises `WorkerGone` there.
Exo catches it and runs its own shutdown; a program that catches nothing unwinds.
The watchdog gives it the grace, and kills it only after that (or after
`WEDGE_SECONDS`, if the handler never ran).

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
from .waiters import confirmed_gone
from .worker_gone import WorkerGone

NOTICE_SIGNAL: Final = signal.SIGUSR1
BEGUN: Final = b"b"
"""On the pipe to the watchdog: the main thread has begun the clean ending."""
SHUTTING_DOWN: Final = b"s"
"""On the pipe to the watchdog: the ending runs the program's own shutdown."""
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


_state: _State | None = None


def install(me: ProcessIdentity, worker: ProcessIdentity, begun: int, grace: float) -> None:
    """Arm the handler (main thread only: Python's rule for signal handlers). `begun`:
    the write end of the pipe whose other end the watchdog reads."""
    global _state
    os.set_blocking(begun, False)
    _state = _State(me, worker, begun, grace)
    signal.signal(NOTICE_SIGNAL, _on_notice)


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
    if state.phase == "ending":
        _tell_watchdog(state, SHUTTING_DOWN)
    try:
        yield
    finally:
        state.sheltered -= 1


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
    # A thread of the worker that exits also fires PR_SET_PDEATHSIG; so does a stray
    # SIGUSR1: only a worker confirmed gone ends the runner.
    if state is None or state.phase == "ending" or not confirmed_gone(state.worker):
        return
    state.phase = "ending"
    sheltered = state.sheltered > 0
    _tell_watchdog(state, BEGUN + (SHUTTING_DOWN if sheltered else b""))
    _until_every_thread_is_gone(state.worker)
    _prepare_to_end()
    logger.warning(
        f"orphan guard: runner {state.me.pid}: its worker {state.worker.pid} died: "
        + ("finishing its shutdown" if sheltered else "ending the clean way")
        + f", killed if it has not exited within {state.grace:g} s"
    )
    if not sheltered:
        raise WorkerGone(f"worker {state.worker.pid} is gone")


def _tell_watchdog(state: _State, news: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(state.begun, news)


def _prepare_to_end() -> None:
    """Nothing the dead worker held may stop the ending half-way."""
    _silence_widowed_output()
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
