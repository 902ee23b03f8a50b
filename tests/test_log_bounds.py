"""How the guardian's log file is kept bounded in place (`guardian.log.keep_bounded`),
on real files; macOS's way to the file's path (`F_GETPATH`) by injection."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from exo_orphan_guard.guardian import log

_DROPPED = b"(older lines dropped: the log is kept under 0 KiB)\n"


def _cut(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.lseek(fd, 0, os.SEEK_END)
        log.keep_bounded(fd, limit=50, keep=20)
        os.write(fd, b"next\n")
    finally:
        os.close(fd)


def test_a_descriptor_without_o_append_goes_on_writing_after_what_was_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"x" * 100 + b"\nkept line\n")
    _cut(path)
    assert path.read_bytes() == _DROPPED + b"kept line\nnext\n"


def test_a_file_under_its_bound_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"short\n")
    _cut(path)
    assert path.read_bytes() == b"short\nnext\n"


def test_on_macos_the_file_is_found_again_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No /proc there: `fcntl(F_GETPATH)` names the file, which is opened and checked
    to be the same one."""
    path = tmp_path / "log"
    path.write_bytes(b"y" * 100 + b"\nkept line\n")
    real_open, real_fcntl = os.open, fcntl.fcntl
    asked: list[int] = []

    def no_proc(target: str | Path, flags: int, *rest: int) -> int:
        if str(target).startswith("/proc/self/fd/"):
            raise FileNotFoundError(target)
        return real_open(target, flags, *rest)

    def get_path(fd: int, command: int, argument: bytes | int = 0) -> bytes | int:
        if command == 50:  # macOS's F_GETPATH
            asked.append(fd)
            return str(path).encode() + b"\0" * 8
        return real_fcntl(fd, command, argument)

    monkeypatch.setattr(os, "open", no_proc)
    monkeypatch.setattr(fcntl, "F_GETPATH", 50, raising=False)
    monkeypatch.setattr(fcntl, "fcntl", get_path)
    _cut(path)
    assert asked and path.read_bytes() == _DROPPED + b"kept line\nnext\n"


def test_a_path_now_naming_another_file_is_not_cut_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log renamed away and another file put in its place: nothing is read from
    that one, and the log is left whole."""
    path, other = tmp_path / "log", tmp_path / "other"
    path.write_bytes(b"z" * 100 + b"\n")
    other.write_bytes(b"not the log\n" * 10)
    real_open = os.open

    def no_proc(target: str | Path, flags: int, *rest: int) -> int:
        if str(target).startswith("/proc/self/fd/"):
            raise FileNotFoundError(target)
        return real_open(target, flags, *rest)

    monkeypatch.setattr(os, "open", no_proc)
    monkeypatch.setattr(fcntl, "F_GETPATH", 50, raising=False)

    def elsewhere(fd: int, command: int, argument: bytes | int = 0) -> bytes:
        return str(other).encode()

    monkeypatch.setattr(fcntl, "fcntl", elsewhere)
    _cut(path)
    assert path.read_bytes() == b"z" * 100 + b"\nnext\n"
