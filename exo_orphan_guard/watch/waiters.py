"""Ways to block until another process has exited: one function each, one dispatcher.

Every waiter fires when the target exits, not when its parent reaps it. Every waiter
can wake for the wrong reason (a multiprocessing sentinel closes when the worker
merely drops its Process object), so the dispatcher re-checks the target's identity
after each wake-up and only reports a death it has confirmed. Callers act on nothing
else.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import select
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any, Final, Literal, Protocol, get_args

from .. import system
from ..system.identity import ProcessIdentity, liveness

WaiterName = Literal["pidfd", "kqueue", "sentinel", "poll"]
WAITER_NAMES: Final[tuple[WaiterName, ...]] = get_args(WaiterName)
POLL_INTERVAL_SECONDS: Final = 0.1
EXIT_SETTLE_SECONDS: Final = 0.05
"""A dying process closes its files before /proc shows it dead: a sentinel's EOF can
arrive a moment before the exit can be confirmed."""


class WaiterUnavailableError(Exception):
    """This waiter cannot watch this target here; the dispatcher tries the next."""


def wait_pidfd(target: ProcessIdentity) -> None:
    """Linux >= 5.3: a pidfd turns readable when the process exits (zombie or not)."""
    try:
        pidfd = os.pidfd_open(target.pid)
    except ProcessLookupError:
        return
    except OSError as error:
        raise WaiterUnavailableError(f"pidfd_open: {error}") from error
    try:
        # The pid may have been reused between recording the target and opening it.
        if liveness(target) == "gone":
            return
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():
            pass
    finally:
        os.close(pidfd)


class KernelQueue(Protocol):
    """The part of `select.kqueue` used here (tests inject one backed by a pidfd)."""

    def control(
        self, changelist: Iterable[object] | None, maxevents: int, timeout: float | None = None, /
    ) -> list[object]: ...

    def close(self) -> None: ...


def _exit_event(pid: int) -> object:
    kernel: Any = select  # kqueue names exist only on macOS and the BSDs
    return kernel.kevent(
        pid,
        filter=kernel.KQ_FILTER_PROC,
        flags=kernel.KQ_EV_ADD | kernel.KQ_EV_ONESHOT,
        fflags=kernel.KQ_NOTE_EXIT,
    )


def _open_kqueue() -> KernelQueue:
    kernel: Any = select
    queue: KernelQueue = kernel.kqueue()
    return queue


def wait_kqueue(
    target: ProcessIdentity,
    open_queue: Callable[[], KernelQueue] = _open_kqueue,
    exit_event: Callable[[int], object] = _exit_event,
) -> None:
    """macOS/BSD: kqueue EVFILT_PROC + NOTE_EXIT fires when the process exits.

    Not psutil's `Process.wait()`: for a process that is not our child that returns only
    once the pid is gone, i.e. when the dead worker's own parent gets round to reaping it.
    """
    try:
        queue = open_queue()
    except OSError as error:
        raise WaiterUnavailableError(f"kqueue: {error}") from error
    try:
        try:
            queue.control([exit_event(target.pid)], 0)
        except ProcessLookupError:
            return  # already exited: a zombie cannot be watched any more
        except OSError as error:
            raise WaiterUnavailableError(f"kevent: {error}") from error
        # The pid may have been reused between recording the target and registering.
        if liveness(target) == "gone":
            return
        while not queue.control(None, 1):
            pass
    finally:
        queue.close()


def wait_sentinel(target: ProcessIdentity) -> None:
    """multiprocessing's parent sentinel: EOF once every copy of the parent's end closes."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid != target.pid:
        raise WaiterUnavailableError("not a multiprocessing child of the watched worker")
    multiprocessing.connection.wait([parent.sentinel])


def wait_poll(target: ProcessIdentity) -> None:
    while liveness(target) != "gone":
        time.sleep(POLL_INTERVAL_SECONDS)


@cache
def can_use_pidfd() -> bool:
    if system.BACKEND != "linux" or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


@cache
def can_use_kqueue() -> bool:
    return sys.platform != "linux" and hasattr(select, "kqueue")


def can_use_sentinel(target: ProcessIdentity) -> bool:
    parent = multiprocessing.parent_process()
    return parent is not None and parent.pid == target.pid


WAITERS: Final[Mapping[WaiterName, Callable[[ProcessIdentity], None]]] = {
    "pidfd": wait_pidfd,
    "kqueue": wait_kqueue,
    "sentinel": wait_sentinel,
    "poll": wait_poll,
}


def usable_waiters(target: ProcessIdentity) -> tuple[WaiterName, ...]:
    """Event-driven first; polling, which always works, last."""
    probes: Mapping[WaiterName, Callable[[], bool]] = {
        "pidfd": can_use_pidfd,
        "kqueue": can_use_kqueue,
        "sentinel": lambda: can_use_sentinel(target),
        "poll": lambda: True,
    }
    return tuple(name for name in WAITER_NAMES if probes[name]())


def wait_for_exit(
    target: ProcessIdentity,
    chain: Sequence[WaiterName],
    waiters: Mapping[WaiterName, Callable[[ProcessIdentity], None]] = WAITERS,
) -> WaiterName:
    """Block until `target` is confirmed gone; return the waiter that saw it go."""
    for name in (*chain, "poll"):
        try:
            waiters[name](target)
        except WaiterUnavailableError as why:
            _debug(f"orphan guard: {name} waiter unavailable ({why}), trying the next")
            continue
        if confirmed_gone(target):
            return name
        _debug(f"orphan guard: {name} woke but process {target.pid} lives on")
    raise AssertionError("unreachable: wait_poll returns only once the target is gone")


def confirmed_gone(target: ProcessIdentity) -> bool:
    """Gone now, or within EXIT_SETTLE_SECONDS."""
    deadline = time.monotonic() + EXIT_SETTLE_SECONDS
    while liveness(target) != "gone":
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def _debug(message: str) -> None:
    # Imported here: loguru brings asyncio, a third of the guardian's start-up, and
    # only a waiter that falls back says anything.
    from loguru import logger

    logger.debug(message)
