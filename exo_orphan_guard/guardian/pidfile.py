"""exo's pidfile, read so that it can never stall the guardian's scans.

exo main writes `exo.pid` in its cache directory (`settings.exo_pidfile`), and the
guardian reads it at each scan, without its lock, to watch an exo before it has
runners. What sits at that path is not the guardian's to trust: a FIFO (opening it
for reading waits for a writer), a device, a huge file, a network mount that no
longer answers (every call into it hangs). So it is read only if it is a regular
file, checked before it is opened and again on what was opened, opened
non-blocking, at most `MAX_BYTES`; and on a thread of its own, which a scan never
waits for: each scan takes the answer to the read asked for before and asks for the
next. A read still under way after `ANSWER_SECONDS` hangs: it holds that one thread,
and the scans go on without the pidfile until it answers again (no second thread is
started meanwhile). The pid found is a scan old at most: exo's pidfile only lets the
guardian watch an exo before it has runners.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, final

MAX_BYTES: Final = 64
ANSWER_SECONDS: Final = 0.1
"""A pidfile on a local disk answers in well under a millisecond: a read still under
way after this long is taken to hang."""


def read_pidfile(path: Path) -> int | None:
    """The pid in exo's pidfile, read without its lock; None if there is none, or
    what is there is not a regular file."""
    with contextlib.suppress(OSError, ValueError):
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            words = os.read(fd, MAX_BYTES).split()
        finally:
            os.close(fd)
        pid = int(words[0]) if words else 0
        return pid if pid > 1 else None
    return None


@final
class PidfileReader:
    """Reads `path` on a thread of its own, which each scan asks and never waits for."""

    def __init__(
        self,
        path: Path,
        read: Callable[[Path], int | None] = read_pidfile,
        answer_seconds: float = ANSWER_SECONDS,
    ) -> None:
        self.path = path
        self._read = read
        self._answer_seconds = answer_seconds
        self._changed = threading.Condition()
        self._asked = 0
        self._asked_at = 0.0
        self._answered = 0
        self._pid: int | None = None
        self._thread: threading.Thread | None = None

    def pid(self) -> tuple[int | None, bool]:
        """The pid the last read found (None: none, or nothing read yet), and whether
        the reads answer; a read is asked for unless one is under way. While a read
        hangs, (None, False)."""
        with self._changed:
            if self._answered < self._asked:
                if time.monotonic() - self._asked_at >= self._answer_seconds:
                    return None, False
                return self._pid, True
            self._asked += 1
            self._asked_at = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="pidfile", daemon=True)
                self._thread.start()
            self._changed.notify_all()
            return self._pid, True

    def _serve(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked > self._answered)
                asked = self._asked
            pid = self._read(self.path)
            with self._changed:
                self._pid = pid
                self._answered = asked
