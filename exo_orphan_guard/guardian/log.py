"""The guardian's log: its lines on stderr, never a reason to fail, and bounded.

A guardian runs for months, unattended. A line it cannot write (a full disk, stderr
on `/dev/full`, a pipe nobody reads any more) is dropped: `say` never raises, so no
scan, ending or wait fails for its log (`say` is also what an ending's waits are told
to). Lines go straight to the file descriptor, unbuffered: a line that could not be
written is not kept in a buffer whose flush at exit would fail the exit too.

When stderr is a regular file (launchd's `StandardErrorPath`, the log a worker-started
guardian writes) it is kept under `MAX_LOG_BYTES`: past that, only its newest
`KEEP_LOG_BYTES` are kept, from the start of a line, after one saying so. In place,
because the guardian does not know the file's name (launchd opened it), and whoever
else writes it appends; a line another guardian appends while it is being cut may be
lost. systemd's journal is a socket, and bounds itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
import time
from typing import Final

MAX_LOG_BYTES: Final = 1 << 20
KEEP_LOG_BYTES: Final = 256 << 10
_DROPPED: Final = "(older lines dropped: the log is kept under {} KiB)\n"


def say(line: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_line(f"{stamp} exo-orphan-guard guardian: {line}\n")


def write_line(text: str, fd: int | None = None) -> None:
    """Append `text` to `fd` (default stderr); nothing if it cannot be written."""
    fd = _stderr_fd() if fd is None else fd
    if fd is None:
        return
    with contextlib.suppress(OSError):
        keep_bounded(fd, MAX_LOG_BYTES, KEEP_LOG_BYTES)
    with contextlib.suppress(OSError):
        data = text.encode(errors="replace")
        while data:
            data = data[os.write(fd, data) :]


def keep_bounded(fd: int, limit: int, keep: int) -> None:
    """If `fd` is a regular file longer than `limit`, cut it to its newest `keep`
    bytes (from a line's start) after a line saying so."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size <= limit:
        return
    reader = _reopened(fd, info)
    if reader is None:
        return
    try:
        tail = os.pread(reader, keep, info.st_size - keep)
    finally:
        os.close(reader)
    start = tail.find(b"\n") + 1
    os.ftruncate(fd, 0)
    # A descriptor opened without O_APPEND would go on writing at its old offset.
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, _DROPPED.format(limit >> 10).encode() + tail[start:])


def _reopened(fd: int, info: os.stat_result) -> int | None:
    """The file `fd` writes, opened again for reading (stderr is write-only): through
    /proc on Linux, by the path macOS gives (`F_GETPATH`), checked to be the same file."""
    try:
        reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        reader = _reopened_by_path(fd)
    if reader is None:
        return None
    again = os.fstat(reader)
    if (again.st_dev, again.st_ino) != (info.st_dev, info.st_ino):
        os.close(reader)
        return None
    return reader


def _reopened_by_path(fd: int) -> int | None:
    get_path: int | None = getattr(fcntl, "F_GETPATH", None)
    if get_path is None:
        return None
    path = fcntl.fcntl(fd, get_path, bytes(1024)).split(b"\0", 1)[0]
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    return os.open(path, flags) if path else None


def _stderr_fd() -> int | None:
    stream = sys.stderr
    if stream is None:  # pyright: ignore[reportUnnecessaryComparison]
        return None
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None
