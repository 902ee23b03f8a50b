"""Waits for events, each with a bound: a test waits for what it expects, never a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exo_orphan_guard.rig.notes import read_notes

_INTERVAL_SECONDS = 0.01


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_INTERVAL_SECONDS)
    return True


def wait_for_note(
    notes: Path,
    pid: int,
    event: str,
    timeout: float = 30.0,
    *,
    where: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """Runner `pid`'s last note of `event` (and, with `where`, one it accepts), once
    there is one; fails the test if none comes within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = [
            note
            for note in read_notes(notes, pid)
            if note["event"] == event and (where is None or where(note))
        ]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"runner {pid} never noted {event!r}"
        time.sleep(_INTERVAL_SECONDS)


QUIET_SECONDS = 0.05
"""Longer than any GIL hand-over wait (CPython's switch interval, 5 ms) many times."""


def main_thread_settled(pid: int) -> bool:
    """Linux: `pid`'s main thread stayed asleep, never woken, through `QUIET_SECONDS`:
    in its long wait, not in a GIL hand-over on its way there. A SIGINT handled on the
    way (in a futex glibc restarts) only sets CPython's flag, and the wait that follows
    never looks at it, so a test of where SIGINT lands sends it only once this holds."""

    def looked() -> tuple[str, ...]:
        with open(f"/proc/{pid}/task/{pid}/status") as status:
            lines = status.read().splitlines()
        return tuple(line for line in lines if line.startswith(("State:", "voluntary_", "nonvol")))

    before = looked()
    if not before or before[0].split()[1] != "S":
        return False
    time.sleep(QUIET_SECONDS)
    return looked() == before
