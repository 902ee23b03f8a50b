"""What a sweep has stopped (SIGSTOP), written down before it is stopped.

A sweep freezes each target's tree so that nothing forks behind its back. If the
sweep itself dies mid-freeze (SIGKILL, exo killed mid-sweep, a crash), the stopped
processes would stay in state T forever: the next sweep reads the journal of a dead
sweeper and continues (SIGCONT) whatever is still stopped, then judges afresh.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Final, final

from .. import system
from ..system import signalling
from ..system.identity import ProcessIdentity, liveness

JOURNAL_PREFIX: Final = "frozen-"
JOURNAL_SUFFIX: Final = ".log"


@final
class FreezeJournal:
    """One sweep's journal: an identity per line, appended before each SIGSTOP."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @staticmethod
    def create(directory: Path, sweeper: ProcessIdentity) -> FreezeJournal | None:
        path = directory / f"{JOURNAL_PREFIX}{sweeper.pid}-{sweeper.started!r}{JOURNAL_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return FreezeJournal(path, os.open(path, flags, 0o600))
        except OSError:
            return None

    def add(self, member: ProcessIdentity) -> bool:
        """False if it could not be written: the member must then not be stopped."""
        line = f"{member.encode()}\n".encode()
        try:
            return os.write(self._fd, line) == len(line)
        except OSError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def thaw_abandoned(directory: Path) -> list[ProcessIdentity]:
    """Continue what dead sweepers left stopped; returns what was continued."""
    continued: list[ProcessIdentity] = []
    for path, sweeper in _journals(directory):
        if liveness(sweeper) != "gone":
            continue  # still sweeping (or unreadable): its freeze is its own business
        for member in _members(path):
            stopped = liveness(member) == "alive" and system.is_stopped(member.pid)
            if stopped and signalling.send(member, signal.SIGCONT) == "sent":
                continued.append(member)
        with contextlib.suppress(OSError):
            os.unlink(path)
    return continued


def _journals(directory: Path) -> Iterator[tuple[Path, ProcessIdentity]]:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(JOURNAL_PREFIX) and name.endswith(JOURNAL_SUFFIX)):
            continue
        encoded = name[len(JOURNAL_PREFIX) : -len(JOURNAL_SUFFIX)].replace("-", ":", 1)
        try:
            yield directory / name, ProcessIdentity.decode(encoded)
        except ValueError:
            continue


def _members(path: Path) -> list[ProcessIdentity]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    members: list[ProcessIdentity] = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            members.append(ProcessIdentity.decode(line))
    return members
