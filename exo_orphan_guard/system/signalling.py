"""Signals that reach exactly the process meant, and an interrupt that reaches its
main thread.

A pid is only a name: once its process exits and is reaped, the next process may get
it. So every signal here goes to an identity (pid and start), checked as it is sent:

- Linux: through a pidfd, opened first. If the identity still holds once the pidfd is
  open, the pidfd is that process's (a live process keeps its pid), and a signal
  through it reaches no other, whatever exits meanwhile.
- Elsewhere (macOS): the identity is read again immediately before `kill()`. What
  remains is the window between that read and the call, a few microseconds, in which
  the process would have to exit, be reaped by its parent, and its pid be handed to a
  new process of the same user; macOS hands out pids in order, so the new process
  would also need the pid counter to wrap around to it within those microseconds.

SIGINT is for an exo runner, and it ends one only on its main thread: CPython runs
Python signal handlers there, and its C handler, run on any other thread, only sets a
flag. An idle runner's main thread is blocked in a lock wait that nothing else wakes,
so a SIGINT that lands on another thread is lost until a SIGKILL ends the runner hard.
Where a signal lands:

- Linux sends a process-directed signal to a thread that "wants" it, the main thread
  first unless it is stopped or already has a signal pending; a stopped process has
  no thread that wants it, and the first thread to run after SIGCONT takes it (in
  trials, a thread other than the main one: 0 of 20); a main thread just continued
  keeps a signal pending until it runs, so even right after SIGCONT a helper thread
  often takes it (9 of 20). So SIGINT goes to the main thread by itself: a thread
  pidfd (`PIDFD_THREAD`, `PIDFD_SIGNAL_THREAD`, Linux 6.9), or on older kernels
  tgkill(2) with the identity checked right before, as on macOS.
- macOS cannot aim at another process's thread, but XNU gives a process-directed
  signal to the first thread of the process that does not block it
  (`get_signalthread`, bsd/kern/kern_sig.c), and the main thread is the first, and
  CPython's never blocks SIGINT.

Either way a stopped process gets SIGCONT first, and SIGINT only once it runs: a
stopped process is never interrupted.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import sys
import time
from collections.abc import Callable
from functools import cache
from typing import Final, Literal, cast

from .. import system
from .identity import ProcessIdentity, liveness

Delivery = Literal["sent", "gone", "stopped", "refused"]
"""sent: delivered to the process meant; gone: it is not there any more (nothing was
sent); stopped: it stays stopped after SIGCONT (traced, say), so SIGINT was not sent;
refused: the kernel would not let this process signal it."""

_PIDFD_THREAD: Final = os.O_EXCL
"""pidfd_open(2): the pidfd refers to that thread, not its thread group."""
_PIDFD_SIGNAL_THREAD: Final = 1
"""pidfd_send_signal(2): deliver to the thread the pidfd refers to."""
RESUME_SECONDS: Final = 1.0
"""How long a stopped process is given to run again after SIGCONT."""
_RESUME_STEP_SECONDS: Final = 0.005


def send(target: ProcessIdentity, number: int) -> Delivery:
    """`number` to `target` if it is still the process identified; else nothing."""
    if _pidfds():
        return _through_pidfd(target, number, thread=False)
    return _by_pid(target, number)


def interrupt(target: ProcessIdentity) -> Delivery:
    """SIGINT to `target`'s main thread, the one where CPython runs a Python handler.

    On a Linux kernel (whichever backend reads the process table) it is aimed at that
    thread, so a stopped target gets it while still stopped, then SIGCONT: the main
    thread takes it as it resumes, in the same pass that ends the stop, and a wait the
    stop interrupted returns EINTR. Sent once the target runs again, it could land in
    the moment the kernel had set that wait up to restart: the wait restarted, the
    handler's flag set and never looked at (3 rounds in 260 on exo's real runner).
    Elsewhere a signal goes to the process, and a stopped one gives it to whichever
    thread runs first: there a stopped target gets SIGCONT first, and SIGINT once it
    runs (`RESUME_SECONDS` at most)."""
    stopped = system.is_stopped(target.pid)
    if sys.platform != "linux":
        if stopped:
            resumed = send(target, signal.SIGCONT)
            if resumed != "sent":
                return resumed
            if not _resumes(target):
                return "gone" if liveness(target) == "gone" else "stopped"
        return send(target, signal.SIGINT)
    if _thread_pidfds():
        delivered = _through_pidfd(target, signal.SIGINT, thread=True)
    else:
        delivered = _to_main_thread(target, signal.SIGINT)
    if delivered != "sent" or not stopped:
        return delivered
    resumed = send(target, signal.SIGCONT)
    if resumed != "sent":
        return resumed
    if not _resumes(target):
        return "gone" if liveness(target) == "gone" else "stopped"
    return "sent"


def _resumes(target: ProcessIdentity) -> bool:
    deadline = time.monotonic() + RESUME_SECONDS
    while system.is_stopped(target.pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_RESUME_STEP_SECONDS)
    return True


def _through_pidfd(target: ProcessIdentity, number: int, *, thread: bool) -> Delivery:
    try:
        # A thread pidfd of the leader: a thread group's leader has the process's pid.
        pidfd = os.pidfd_open(target.pid, _PIDFD_THREAD if thread else 0)
    except ProcessLookupError:
        return "gone"
    except OSError:
        return "refused"
    try:
        state = liveness(target)
        if state != "alive":
            return "gone" if state == "gone" else "refused"
        try:
            signal.pidfd_send_signal(pidfd, number, None, _PIDFD_SIGNAL_THREAD if thread else 0)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            return "refused"
        return "sent"
    finally:
        os.close(pidfd)


def _by_pid(target: ProcessIdentity, number: int) -> Delivery:
    state = liveness(target)
    if state != "alive":
        return "gone" if state == "gone" else "refused"
    try:
        os.kill(target.pid, number)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "refused"
    return "sent"


@cache
def _pidfds() -> bool:
    if system.BACKEND != "linux" or not hasattr(os, "pidfd_open"):
        return False
    with contextlib.suppress(OSError):
        os.close(os.pidfd_open(os.getpid()))
        return True
    return False


@cache
def _thread_pidfds() -> bool:
    """Linux 6.9 and later: a pidfd for one thread, and signals to it alone."""
    if sys.platform != "linux" or not hasattr(os, "pidfd_open"):
        return False
    with contextlib.suppress(OSError):
        os.close(os.pidfd_open(os.getpid(), _PIDFD_THREAD))
        return True
    return False


def _to_main_thread(target: ProcessIdentity, number: int) -> Delivery:
    """tgkill(2) to the thread whose id is the pid, the main thread, for kernels older
    than thread pidfds: the identity is checked right before, as on macOS. Without
    tgkill in the C library, process-directed: the target was seen running, and a
    running main thread takes a process-directed signal first."""
    tgkill = _tgkill()
    if tgkill is None:
        return send(target, number)
    state = liveness(target)
    if state != "alive":
        return "gone" if state == "gone" else "refused"
    if tgkill(target.pid, target.pid, number) == 0:
        return "sent"
    return "gone" if ctypes.get_errno() == errno.ESRCH else "refused"


@cache
def _tgkill() -> Callable[[int, int, int], int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "tgkill", None)
    if function is None:
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
    function.restype = ctypes.c_int
    return cast("Callable[[int, int, int], int]", function)
