"""Whether the notice can still reach the guard's handler, and telling the main thread
without it.

The notice is a signal (`NOTICE_SIGNAL`, SIGUSR1) whose Python handler the guard
installs. Two things keep it from that handler, and `signal.getsignal` sees neither:

- Another handler installed below Python, with `sigaction` itself. The usual "dump my
  stacks" hook, `faulthandler.register(SIGUSR1)`, does this, and by default
  (`chain=False`) never passes the signal on: every notice then only dumps stacks, the
  heartbeat thread keeps beating, and the runner passes for one busy in a GIL-free call
  until the busy wait kills it. A native library may do the same.
- The signal blocked. A thread that blocks it never takes it, and one blocked before
  the guard's threads start is blocked in all of them (a thread inherits its creator's
  mask), so no thread runs Python's C handler and the Python handler is never scheduled.

So `arm` reads the process's `sigaction` for the signal right after the guard installs
its handler, and `reach`, at notice time (from the heartbeat thread, once the watchdog
has confirmed the worker dead: taking the signal back costs the runner nothing it
still needs), reads it again: a different handler is replaced by the one armed, and the
notice is sent again. Whatever it finds, it also gives the notice without a signal:
`_thread.interrupt_main` schedules the Python handler for the main thread's next
bytecode, past any `sigaction` and any mask. That wakes nothing: a main thread blocked
in a system call with the signal blocked runs the handler only once the call returns.

What it found goes to the watchdog, a byte each, before the main thread is told (it may
exit at once), and into the ending's `why`.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Final, Protocol, final

from .. import system

TAKEN_OVER: Final = b"o"
"""On the pipe to the watchdog: another handler had taken the notice signal over below
Python; the armed one is back and the notice was sent again."""
STILL_TAKEN: Final = b"x"
"""On the pipe to the watchdog: another handler had taken it over and could not be
replaced."""
BLOCKED: Final = b"m"
"""On the pipe to the watchdog: the main thread blocks the notice signal."""
NOT_OURS: Final = b"p"
"""On the pipe to the watchdog: the signal's Python handler is no longer the guard's."""

_SAID: Final[Mapping[bytes, str]] = {
    TAKEN_OVER: "its notice signal {name} had been taken over below Python "
    "(faulthandler.register?): put back, and sent again",
    STILL_TAKEN: "its notice signal {name} had been taken over below Python "
    "(faulthandler.register?) and could not be put back",
    BLOCKED: "its notice signal {name} was blocked on its main thread: told without it "
    "(interrupt_main), which that thread takes once it runs Python",
    NOT_OURS: "its notice signal {name} had another Python handler, set after the guard's: "
    "the notice could not reach the guard",
}
NEWS: Final = frozenset(_SAID)

_ACTION_BYTES: Final = 1024
"""Room for any libc's `struct sigaction` (glibc's is 152 bytes on 64-bit Linux,
macOS's 16): only its start is read."""
_AGAIN_AT: Final = (0.05, 0.15, 0.35, 0.75, 1.55)
"""When, from the first, the notice goes again after a takeover, while the handler has
not been entered."""
_BEAT_SECONDS: Final = 0.1
_STEADY_SECONDS: Final = 0.1
_STEADY_READS_SECONDS: Final = 0.005
_HANDLER_FIRST: Final = not platform.machine().lower().startswith("mips")
"""The handler is the struct's first field, pointer-sized, on macOS, the BSDs and Linux
(glibc, musl) but on MIPS, where `sa_flags` comes first: there it is not read."""


class SignalLibc(Protocol):
    """The libc call used here (tests pass a fake)."""

    def sigaction(self, signal_number: int, action: object, old: object, /) -> int: ...


@final
@dataclass(frozen=True, slots=True)
class Armed:
    """The notice signal as the guard armed it."""

    signal_number: signal.Signals
    handler: object
    """The guard's Python handler."""
    action: bytes | None
    """The process's `struct sigaction`, raw; None where it cannot be read."""
    blocked: bool
    """The main thread blocked the signal as the guard armed it."""


def arm(
    signal_number: signal.Signals,
    handler: object,
    read: Callable[[int], bytes | None] | None = None,
) -> Armed:
    """On the main thread, right after `signal.signal(signal_number, handler)`. Never
    raises: a mask that cannot be read counts as unblocked."""
    blocked = False
    with contextlib.suppress(OSError, ValueError):
        blocked = signal_number in signal.pthread_sigmask(signal.SIG_BLOCK, ())
    return Armed(signal_number, handler, (read or read_action)(signal_number), blocked)


def reach(
    armed: Armed | None,
    *,
    deliver: Callable[[], None],
    tell: Callable[[bytes], None],
    entered: Callable[[], float],
    beat: Callable[[], None],
    read: Callable[[int], bytes | None] | None = None,
    write: Callable[[int, bytes], bool] | None = None,
    python_handler: Callable[[int], object] = signal.getsignal,
    main_blocks: Callable[[int], bool | None] | None = None,
    interrupt: Callable[[signal.Signals], None] = _thread.interrupt_main,
    again_at: tuple[float, ...] = _AGAIN_AT,
) -> None:
    """At notice time, from any thread: see that the notice reaches the guard's handler
    on the main thread, and `tell` the watchdog what was in its way (nothing: no call).
    `deliver` sends the main thread the signal; `entered` answers when it last entered
    the handler (`time.monotonic()`); `beat` is the heartbeat, for while this waits.
    Never raises: the heartbeat must go on."""
    if armed is None:
        return
    number = armed.signal_number
    news = b""
    with contextlib.suppress(Exception):
        if python_handler(number) is not armed.handler:
            # signal.signal after guard_runner: only the main thread could put the
            # guard's back, and interrupt_main would run the other one.
            tell(NOT_OURS)
            return
        news = _taken_over(armed, read or read_action, write or write_action)
    blocked = None
    if not news:  # while another handler runs, the kernel blocks the signal there
        with contextlib.suppress(Exception):
            blocked = (main_blocks or main_thread_blocks)(number)
    if blocked or (blocked is None and armed.blocked):
        news += BLOCKED
    if news:
        tell(news)  # first: once told, the main thread may exit at once
    since = time.monotonic()
    with contextlib.suppress(Exception):
        interrupt(number)
        if news.startswith(TAKEN_OVER):
            deliver()  # the first notices were taken by the other handler
            _deliver_until_entered(deliver, entered, beat, since, again_at)


def _deliver_until_entered(
    deliver: Callable[[], None],
    entered: Callable[[], float],
    beat: Callable[[], None],
    since: float,
    again_at: tuple[float, ...],
) -> None:
    """A signal that comes while the other handler still runs (faulthandler's dump of
    every thread takes a while) waits until it returns, and by then that handler's
    `SA_RESTART` has set the interrupted `read` to be restarted: the guard's handler
    runs, but the main thread goes back into the `read`. So the signal goes again, at
    `again_at` seconds from `since`, until the handler has been entered. Here, not in
    a thread of its own: a thread that starts or exits while faulthandler dumps every
    thread can crash the dump (it reads their states without a lock)."""
    for at in again_at:
        while (left := since + at - time.monotonic()) > 0:
            time.sleep(min(left, _BEAT_SECONDS))
            beat()
        if entered() >= since:
            return
        deliver()


def said(found: bytes, signal_number: int) -> str:
    """What `reach` found, for an ending's `why` (empty, or "; " and a clause each)."""
    name = signal.Signals(signal_number).name
    return "".join(f"; {_SAID[bytes((byte,))].format(name=name)}" for byte in found)


def _taken_over(
    armed: Armed, read: Callable[[int], bytes | None], write: Callable[[int, bytes], bool]
) -> bytes:
    if armed.action is None:
        return b""
    now = read(armed.signal_number)
    if now is None or handler_of(now) == handler_of(armed.action):
        return b""
    return TAKEN_OVER if write(armed.signal_number, armed.action) else STILL_TAKEN


def main_thread_blocks(
    signal_number: int,
    read: Callable[[int, int], bool | None] | None = None,
    steady: float = _STEADY_SECONDS,
) -> bool | None:
    """Whether the main thread blocks the signal, and keeps blocking it for `steady`
    seconds: while a thread runs the C handler of one notice the kernel blocks the
    signal there (a moment, longer if the thread is preempted), which is no block of
    the program's. None: its mask cannot be read here."""
    native = threading.main_thread().native_id
    if native is None:
        return None
    deadline = time.monotonic() + steady
    while True:
        blocked = (read or system.thread_blocks_signal)(native, signal_number)
        if not blocked or time.monotonic() >= deadline:
            return blocked
        time.sleep(_STEADY_READS_SECONDS)


def handler_of(action: bytes) -> int:
    """The handler's address in a raw `struct sigaction` (only the handler is compared:
    glibc leaves the tail of the mask it returns undefined)."""
    return int.from_bytes(action[: ctypes.sizeof(ctypes.c_void_p)], sys.byteorder)


def read_action(signal_number: int, libc: SignalLibc | None = None) -> bytes | None:
    """The process's `struct sigaction` for the signal, raw; None where it cannot be read."""
    if not _HANDLER_FIRST:
        return None
    buffer = ctypes.create_string_buffer(_ACTION_BYTES)
    with contextlib.suppress(OSError, AttributeError):
        if (libc or _libc()).sigaction(signal_number, None, buffer) == 0:
            return buffer.raw
    return None


def write_action(signal_number: int, action: bytes, libc: SignalLibc | None = None) -> bool:
    """Install a `struct sigaction` that `read_action` read (process-wide, from any thread)."""
    buffer = ctypes.create_string_buffer(action, _ACTION_BYTES)
    with contextlib.suppress(OSError, AttributeError):
        return (libc or _libc()).sigaction(signal_number, buffer, None) == 0
    return False


@cache
def _libc() -> SignalLibc:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sigaction.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    libc.sigaction.restype = ctypes.c_int
    return libc  # pyright: ignore[reportReturnType]
