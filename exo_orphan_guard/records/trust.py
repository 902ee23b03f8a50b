"""Whether a file or directory of the registry can be trusted: what another user could
have written or swapped (a foreign owner, group- or other-writable, a symlink, not
the kind expected) is refused, never read nor acted on.

One check for the registry's directories, its records, the endings log and the
records moved from a legacy host directory.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Literal

Kind = Literal["directory", "file"]


def problem(info: os.stat_result, uid: int, kind: Kind) -> str | None:
    """Why an entry of `kind` (from `os.lstat` or `os.fstat`) must not be trusted by
    `uid`, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if kind == "directory" and not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if kind == "file" and not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != uid:
        return f"is owned by uid {info.st_uid}, not {uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def file_problem(info: os.stat_result, uid: int) -> str | None:
    return problem(info, uid, "file")


def open_trusted(
    path: Path, uid: int, check: Callable[[os.stat_result, int], str | None] = file_problem
) -> BinaryIO:
    """`path` opened for reading, if `check` finds nothing wrong with it: judged before
    it is opened (no device or FIFO is ever opened) and again on what was opened (a
    swap between the two is caught). ValueError (why) if it must not be trusted;
    OSError if it cannot be read."""
    found = check(os.lstat(path), uid)
    if found is not None:
        raise ValueError(found)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError("is a symlink") from error
        raise
    file = os.fdopen(fd, "rb")
    found = check(os.fstat(file.fileno()), uid)
    if found is not None:
        file.close()
        raise ValueError(found)
    return file
