"""What the dead worker held must not stop a runner's ending half-way.

Once the worker is gone, the runner's stdout and stderr may be pipes nobody reads,
its loguru sinks may forward into a pipe only the worker drained, and multiprocessing
would join queue feeder threads blocked on pipes that never empty. The notice
handler (and, for the log sinks, the heartbeat thread as soon as the notice comes)
lets go of each.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import sys
import time
from typing import Final

from .. import system
from ..system.identity import ProcessIdentity

_WIDOWED: Final = select.POLLERR | select.POLLHUP
_BEFORE_QUEUE_JOINS: Final = 100
_THREADS_GONE_SECONDS: Final = 0.1


def let_go_of(worker: ProcessIdentity) -> None:
    """Nothing the dead worker held may stop the ending half-way."""
    _silence_widowed_output()
    stop_widowed_log_queues(worker)
    _skip_queue_joins()
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        # Again at exit, before multiprocessing's own joins (priority -5): a queue first
        # used during the ending has its feeder thread, and its join, only from then.
        util.Finalize(None, _skip_queue_joins, exitpriority=_BEFORE_QUEUE_JOINS)


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


def stop_widowed_log_queues(worker: ProcessIdentity) -> None:
    """loguru's sinks added with `enqueue=True` (exo's `logger_setup`) write into a pipe
    read by a thread of the process that added them: the dead worker. The runner holds
    that pipe's read end too (pickled with the logger), so a write never fails: it
    blocks for good once the pipe is full. From now on such handlers drop what they are
    given (nobody would read it); the runner's own sinks, and queues whose reader
    lives, are left alone. The class is patched, not the handlers: the runner's logger
    is an unpickled copy, out of reach of `loguru.logger`. The heartbeat thread does it
    as soon as the watchdog's notice comes, the handler again (a no-op then): a thread
    that logs while the main thread is still in native code would otherwise fill the
    pipe and block there, and the exit's join with it, before the handler ever ran."""
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


def until_every_thread_is_gone(worker: ProcessIdentity) -> None:
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
