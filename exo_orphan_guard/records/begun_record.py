"""The endings sweepers have begun, one record per user and machine (`user_dir`).

A sweeper (the guardian, a sweep, exo's worker hook) writes a `begun` line here, as
in its registry's `endings.jsonl`, as its SIGINT goes out (or as it leaves alone for
the grace a runner that hands itself exo's own Shutdown), with the deadline of its
SIGKILL; every sweeper reads these lines beside its registry's before it signals
(`sweep_endings.Ledger`). The registry follows the environment and this file does
not, so a sweeper configured otherwise still waits for another's ending instead of
cutting its unwinding short with a second SIGINT.

A line matters only until its deadline (`time.monotonic()`: one clock for every
process of a boot), and `compact` drops the others. Appends and `compact` take the
file's `flock`, and `compact` rewrites it in place: a line appended meanwhile is
never lost in a file renamed away.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Final, final

from . import trust
from .endings import MAX_READ_BYTES, Ending, parse_line
from .user_dir import user_dir

NAME: Final = "begun.jsonl"
_LOCK_TRIES: Final = 100
_LOCK_PAUSE_SECONDS: Final = 0.01
"""Another holds the lock for one write or one rewrite of a small file: a try every
10 ms for a second, then the line is written without it (a compaction at that very
moment could drop it)."""


def append(directory: Path, ending: Ending) -> bool:
    """Add one line to the record in `directory`; False if it could not be written."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(directory / NAME, flags, 0o600)
    except OSError:
        return False
    try:
        if trust.file_problem(os.fstat(fd), os.geteuid()) is not None:
            return False
        _lock(fd)
        os.write(fd, ending.to_line())
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def read(directory: Path, boot_id: str) -> list[Ending]:
    """This boot's lines in the record in `directory`, oldest first; nothing if there
    is none or it is not to be trusted."""
    try:
        file = trust.open_trusted(directory / NAME, os.geteuid())
    except (OSError, ValueError):
        return []
    with file:
        data = _tail(file.fileno())
    lines = (parse_line(line) for line in data.splitlines())
    return [line for line in lines if line is not None and line.boot_id == boot_id]


def compact(directory: Path, boot_id: str, now: float) -> None:
    """Drop the lines of other boots and those whose deadline is past `now`."""
    path = directory / NAME
    with contextlib.suppress(OSError, ValueError):
        found = trust.file_problem(os.lstat(path), os.geteuid())
        if found is not None:
            return
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if trust.file_problem(os.fstat(fd), os.geteuid()) is not None:
                return
            _lock(fd)
            lines = _tail(fd).splitlines(keepends=True)
            kept = [line for line in lines if _current(line, boot_id, now)]
            if len(kept) == len(lines):
                return
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, b"".join(kept))
        finally:
            os.close(fd)


def _current(line: bytes, boot_id: str, now: float) -> bool:
    ending = parse_line(line)
    return (
        ending is not None
        and ending.boot_id == boot_id
        and ending.deadline is not None
        and ending.deadline > now
    )


def _tail(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, MAX_READ_BYTES, max(0, size - MAX_READ_BYTES))


def _lock(fd: int) -> None:
    for _ in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(_LOCK_PAUSE_SECONDS)


@final
class BegunRecord:
    """The record of this user and machine, found when first needed: made only to be
    written to (a dry run makes nothing)."""

    def __init__(self) -> None:
        self._directory: Path | None = None

    def read(self, boot_id: str) -> list[Ending]:
        directory = self._directory or user_dir(create=False)[0]
        return [] if directory is None else read(directory, boot_id)

    def append(self, ending: Ending) -> bool:
        if self._directory is None:
            self._directory = user_dir(create=True)[0]
        return self._directory is not None and append(self._directory, ending)
