"""`doctor`'s lines on the clean ending's bounds: the settings in force (and any value
that was not taken), and the runners whose ending is under way: busy in native code
(waited for until the busy wait) or ending the clean way (until their grace)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from ..records import endings
from ..records.endings import Ending
from ..system import settings
from ..system.identity import liveness
from .check import Check

_LISTED = 3


def other_setting_warnings(environ: Mapping[str, str]) -> tuple[str, ...]:
    """What each setting beside the bounds would warn about, as its parser says it."""
    parsed = (
        settings.parse_strategy(environ.get(settings.STRATEGY_ENV)),
        settings.parse_backend(environ.get(settings.BACKEND_ENV)),
        settings.parse_scan_interval(environ.get(settings.SCAN_INTERVAL_ENV)),
    )
    return tuple(value.warning for value in parsed if value.warning is not None)


def settings_check(
    grace: settings.Parsed[float],
    busy_wait: settings.Parsed[float],
    others: Sequence[str] = (),
) -> Check:
    """The settings as this environment sets them; a bad value is a warning naming it
    (`others`: those of the settings beside the bounds)."""
    detail = (
        f"{settings.GRACE_ENV} {grace.value:g} s (the clean ending, once begun), "
        f"{settings.BUSY_WAIT_ENV} {busy_wait.value:g} s (a runner busy in native code"
        + (", 0: the 0.5 s wedge bound)" if busy_wait.value == 0 else ")")
        + "".join(
            f", {name} {os.environ.get(name) or 'auto'}"
            for name in (settings.STRATEGY_ENV, settings.BACKEND_ENV)
        )
    )
    figures = {"grace_s": grace.value, "busy_wait_s": busy_wait.value}
    problems = [parsed.warning for parsed in (grace, busy_wait) if parsed.warning is not None]
    problems += others
    if problems:
        return Check(
            "settings",
            "WARN",
            f"{detail}; " + "; ".join(problems),
            "fix the value where exo is started: the guard uses the value named meanwhile",
            figures,
        )
    return Check("settings", "OK", detail, None, figures)


def under_way_check(seen: Sequence[Ending], now: float | None = None) -> Check:
    """Runners still alive whose newest line is `busy` or `begun`."""
    wall = time.time() if now is None else now
    waiting = [
        ending
        for ending in endings.latest(seen).values()
        if ending.event in ("busy", "begun") and liveness(ending.identity) != "gone"
    ]
    if not waiting:
        return Check("endings under way", "OK", "none", None, {"busy": 0, "ending": 0})
    busy = sum(ending.event == "busy" for ending in waiting)
    listed = "; ".join(_described(ending, wall) for ending in waiting[:_LISTED])
    more = f" (and {len(waiting) - _LISTED} more)" if len(waiting) > _LISTED else ""
    return Check(
        "endings under way",
        "WARN",
        f"{len(waiting)} runner(s) of a dead worker still ending: {listed}{more}",
        "wait: each ends by itself or is killed at its bound; to kill at once (it may "
        "strand wired memory on macOS): exo-orphan-guard sweep --now",
        {"busy": busy, "ending": len(waiting) - busy},
    )


def _described(ending: Ending, wall: float) -> str:
    if ending.event == "busy":
        bound = "" if ending.busy_wait is None else f", killed at {ending.busy_wait:g} s"
        since = max(0.0, wall - ending.at)
        gil = ending.gil or "held or free"
        return (
            f"pid {ending.pid} busy in native code {since:.0f} s, GIL {gil}{bound} "
            "unless it returns"
        )
    return f"pid {ending.pid} ending the clean way ({ending.why})"
