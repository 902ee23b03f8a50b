"""Waits for events, each with a bound: a test waits for what it expects, never a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable

_INTERVAL_SECONDS = 0.01


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_INTERVAL_SECONDS)
    return True
