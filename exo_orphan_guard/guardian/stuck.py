"""Runners stuck in the kernel: said once, tried again ever more rarely.

A runner in uninterruptible sleep (D on Linux, U on macOS: a driver call, a hung
mount) outlives SIGKILL until the kernel lets it go, and then the SIGKILL already
sent ends it. Every scan finds it again as an orphan: without this, each ending it
again (SIGINT, its wait, SIGKILL) every two minutes, saying so each time, forever.
The guardian remembers such a runner instead: scans leave it be until its next try,
`first` seconds after it survived and twice as long after each try, up to
`LAST_RETRY_SECONDS`; its survival is said once, and so is its end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, final

from ..system.identity import Liveness, ProcessIdentity, liveness

FIRST_RETRY_SCANS: Final = 30
"""A minute at the default scan interval."""
LAST_RETRY_SECONDS: Final = 3600.0


@final
@dataclass(frozen=True, slots=True)
class _Rest:
    until: float
    """`time.monotonic()` of its next try."""
    seconds: float
    """How long it rested last."""


@final
class StuckRunners:
    """The runners that survived SIGKILL, each resting until its next try."""

    def __init__(
        self, first: float, alive: Callable[[ProcessIdentity], Liveness] = liveness
    ) -> None:
        self._first = first
        self._alive = alive
        self._lock = threading.Lock()
        self._resting: dict[ProcessIdentity, _Rest] = {}

    def survived(self, runner: ProcessIdentity, now: float) -> bool:
        """`runner` survived SIGKILL (again): it rests, twice as long as last time.
        Whether this is news (the first time: worth saying)."""
        with self._lock:
            last = self._resting.get(runner)
            seconds = self._first if last is None else min(2 * last.seconds, LAST_RETRY_SECONDS)
            self._resting[runner] = _Rest(now + seconds, seconds)
        return last is None

    def resting(self, now: float) -> frozenset[ProcessIdentity]:
        """The stuck runners no ending should try now."""
        with self._lock:
            return frozenset(runner for runner, rest in self._resting.items() if rest.until > now)

    def known(self, runner: ProcessIdentity) -> bool:
        with self._lock:
            return runner in self._resting

    def gone(self) -> list[ProcessIdentity]:
        """The stuck runners that are gone now (the kernel let them go), forgotten."""
        with self._lock:
            runners = list(self._resting)
        left = [runner for runner in runners if self._alive(runner) == "gone"]
        with self._lock:
            for runner in left:
                self._resting.pop(runner, None)
        return left
