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
