"""Linux: what may change while a process lives: most of it from one read of
/proc/<pid>/stat, the signal sets from its status file."""

from __future__ import annotations

import os
import signal
from typing import Final

from .process_facts import MemoryUsage, ProcessStart, ProcessState

_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
_EXITED_STATES: Final = frozenset({"Z", "X", "x"})
STATUS_WORDS: Final = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "tracing-stop",
    "Z": "zombie",
    "X": "dead",
    "x": "dead",
    "K": "wake-kill",
    "W": "waking",
    "I": "idle",
    "P": "parked",
}
"""psutil's status words for the stat file's state letters (psutil's `_pslinux`)."""
# Fields of /proc/<pid>/stat after the command's ')', counted from the state (field 3).
_STATE, _PPID, _PGRP, _RSS, _START, _SIGIGNORE = 0, 1, 2, 21, 19, 30
_SIGINT_BIT: Final = 1 << (signal.SIGINT - 1)
"""In the ignored signals' mask (field 33: the first 31 signals, what /proc/<pid>/status
shows as `SigIgn`)."""
_IMAGE_FIELDS: Final = (23, 24, 25, 42, 43, 44, 45, 46, 47, 48)
"""startcode, endcode, startstack, start_data, end_data, start_brk, arg_start, arg_end,
env_start, env_end (fields 26-28, 45-51): set by each exec, randomized where ASLR is
on, and shown as 0 to a reader without ptrace access (and for a zombie)."""


def process_state(pid: int) -> ProcessState | None:
    """None if the stat file (or the command line and executable, for `image`) cannot be
    read cleanly: the caller then reads everything the full way."""
    try:
        data = _read(f"/proc/{pid}/stat")
        command_line = _read(f"/proc/{pid}/cmdline")
    except OSError:
        return None
    try:
        exe: str | None = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = None
    try:
        fields = data[data.rindex(b")") + 2 :].split()
        state = fields[_STATE].decode()
        addresses = tuple(int(fields[index]) for index in _IMAGE_FIELDS)
        ppid, pgrp = int(fields[_PPID]), int(fields[_PGRP])
        rss = int(fields[_RSS]) * _PAGE_SIZE
        start = int(fields[_START]) / _CLOCK_TICKS
        ignored = int(fields[_SIGIGNORE])
    except (ValueError, IndexError):
        return None
    exited = state in _EXITED_STATES
    readable = any(addresses) and exe is not None and bool(command_line)
    return ProcessState(
        start=ProcessStart(start, exited),
        ppid=ppid,
        status=STATUS_WORDS.get(state, state),
        pgid=pgrp,
        rss=None if exited else rss,
        memory=None if exited else MemoryUsage("rss", rss),
        image=(addresses, exe, command_line) if readable and not exited else None,
        ignores_sigint=None if exited else bool(ignored & _SIGINT_BIT),
    )


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def thread_blocks_signal(thread: int, signal_number: int) -> bool | None:
    return _signal_set_has(f"/proc/self/task/{thread}/status", b"SigBlk:", signal_number)


def is_exiting(pid: int) -> bool | None:
    """A SIGKILL pending: the process dies at its next step. On a loaded machine that
    step can wait in D for seconds (tearing down its memory, waiting for a lock); one
    that waits for good is told by staying so past the engine's longer wait."""
    pending = [
        _signal_set_has(f"/proc/{pid}/status", field, signal.SIGKILL)
        for field in (b"SigPnd:", b"ShdPnd:")
    ]
    return None if None in pending else any(pending)


def ignores_signal(pid: int, signal_number: int) -> bool | None:
    return _signal_set_has(f"/proc/{pid}/status", b"SigIgn:", signal_number)


def _signal_set_has(path: str, field: bytes, signal_number: int) -> bool | None:
    """Whether the signal set `field` of a status file holds the signal; None if the
    file (its process or thread gone) or the field cannot be read."""
    try:
        status = _read(path)
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith(field):
            try:
                return bool(int(line.split()[1], 16) >> (signal_number - 1) & 1)
            except (IndexError, ValueError):
                return None
    return None
