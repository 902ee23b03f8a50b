"""The service's own file on disk: read, written, removed.

Written only into a directory that was checked once opened (a real directory, owned by
the user the service is for, writable by no one else), through that directory's
descriptor, as a new file (`O_CREAT|O_EXCL|O_NOFOLLOW`) renamed over the old one: a
link planted in the directory, or a directory swapped after the check, is never
written through.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Final

from ..records import trust
from . import service_files
from .service_control import FileState

DIRECTORY_MODE: Final = 0o755
"""What launchd's and systemd's own directories have; the file is readable by all too
(its text holds no secret, and the manager reads it)."""
FILE_MODE: Final = 0o644


def write(path: Path, text: str, uid: int) -> str | None:
    """Write `text` to `path` for `uid`; None when written, else why not (one line)."""
    directory = path.parent
    try:
        _make_directories(directory)
        directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        return f"cannot make {directory} ({error.strerror})"
    try:
        problem = trust.problem(os.fstat(directory_fd), uid, "directory")
        if problem is not None:
            return f"{directory} {problem}: refusing to write {path.name} into it"
        _replace(directory_fd, path.name, text)
    except OSError as error:
        return f"cannot write {path} ({error.strerror})"
    finally:
        os.close(directory_fd)
    return None


def make_log_directory(directory: Path, uid: int) -> str | None:
    """Make the directory launchd writes the guardian's log into (it makes none), as
    the registry makes it (private); None when it is there and trusted, else why not."""
    try:
        _make_directories(directory, last_mode=0o700)
        problem = trust.problem(os.lstat(directory), uid, "directory")
    except OSError as error:
        return f"cannot make {directory} ({error.strerror})"
    return None if problem is None else f"{directory} {problem}: refusing to log into it"


def _replace(directory_fd: int, name: str, text: str) -> None:
    temporary = f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, FILE_MODE, dir_fd=directory_fd)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
            os.fchmod(file.fileno(), FILE_MODE)  # whatever the umask
        os.replace(temporary, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory_fd)
        raise


def _make_directories(directory: Path, last_mode: int = DIRECTORY_MODE) -> None:
    missing: list[Path] = []
    while not os.path.lexists(directory):
        missing.append(directory)
        directory = directory.parent
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(made, last_mode if made is missing[0] else DIRECTORY_MODE)


def remove(path: Path, lines: list[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        lines.append(f"removed {path}")


def remove_if_empty(directory: Path | None) -> None:
    # Made for the log (by `install`) or the link (by `enable`): kept while anything
    # else is in it.
    if directory is not None:
        with contextlib.suppress(OSError):
            directory.rmdir()


def file_state(path: Path, text: str) -> FileState:
    try:
        found = path.read_text()
    except FileNotFoundError:
        return "absent"
    except (OSError, UnicodeDecodeError):
        return "different"
    return "same" if found == text else "different"


def installed_log(path: Path) -> Path | None:
    try:
        return service_files.installed_log(path.read_text())
    except (OSError, UnicodeDecodeError):
        return None
