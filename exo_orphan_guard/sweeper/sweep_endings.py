"""What a sweep makes of endings: it waits for runners ending cleanly, says how each
orphan it ended went, and writes that down for `doctor`.

The first two are pure (records and endings in, deadlines and labels out); `write`
is the one effect.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..records import endings
from ..records.endings import Ending, How
from ..system.identity import ProcessIdentity
from ..system.settings import WEDGE_SECONDS
from .killing import KillResult
from .verdicts import Verdict


def patience(
    verdicts: Sequence[Verdict], latest: Mapping[ProcessIdentity, Ending], now: float
) -> dict[ProcessIdentity, float]:
    """Targets to leave alone, each until its deadline (`time.monotonic()`): recorded
    runners with a clean ending that has not ended yet."""
    waits: dict[ProcessIdentity, float] = {}
    for verdict in verdicts:
        if verdict.action != "kill" or verdict.rule != "registry" or verdict.record is None:
            continue
        target = verdict.record.record.identity
        deadline = endings.clean_deadline(
            latest.get(target), verdict.record.record.grace, now, WEDGE_SECONDS
        )
        if deadline is not None:
            waits[target] = deadline
    return waits


def wait_lines(
    verdicts: Sequence[Verdict],
    waits: Mapping[ProcessIdentity, float],
    latest: Mapping[ProcessIdentity, Ending],
    now: float,
    wall_now: float,
) -> list[str]:
    """One line per runner waited for: which, why, and until when (local time)."""
    lines: list[str] = []
    for verdict in verdicts:
        if verdict.record is None or verdict.record.record.identity not in waits:
            continue
        target = verdict.record.record.identity
        seconds = max(0.0, waits[target] - now)
        until = time.strftime("%H:%M:%S", time.localtime(wall_now + seconds))
        labels = "".join(f" {key}={value}" for key, value in sorted(verdict.labels.items()))
        ending = latest.get(target)
        if ending is not None and ending.event == "busy":
            bound = "" if ending.busy_wait is None else f", killed at {ending.busy_wait:g} s"
            why = (
                f"its worker is gone; busy in native code "
                f"{max(0.0, wall_now - ending.at):.0f} s, GIL {ending.gil or 'held or free'}"
                f"{bound} unless it returns"
            )
        elif ending is not None and ending.event == "begun":
            why = "its worker is gone and its clean ending has begun"
        else:
            why = "its worker is gone and its watchdog is about to say how it ends"
        lines.append(
            f"waiting for runner {target.pid}{labels} to end by itself ({why}) until "
            f"{until} ({seconds:.1f} s), then it is stopped"
        )
    return lines


def with_endings(
    results: Sequence[KillResult],
    verdicts: Sequence[Verdict],
    latest: Mapping[ProcessIdentity, Ending],
) -> list[KillResult]:
    """Each result with how its target ended: what its watchdog recorded, else what
    the sweep saw. SIGTERM ends a guarded runner the clean way (its handler asks for
    the clean ending); anyone else's default action for it is a kill."""
    guarded = {
        verdict.record.record.identity
        for verdict in verdicts
        if verdict.record is not None and (verdict.record.record.grace or 0) > 0
    }
    ended: list[KillResult] = []
    for result in results:
        recorded = latest.get(result.target)
        how: How | None
        if result.outcome == "unkillable":
            how = None
        elif recorded is not None and recorded.how is not None:
            how = recorded.how
        elif result.outcome == "exited":
            how = "clean"
        elif "SIGKILL" in result.signals or result.target not in guarded:
            how = "killed"
        else:
            how = "clean"
        ended.append(dataclasses.replace(result, ended=how))
    return ended


def write(
    path: Path,
    results: Sequence[KillResult],
    latest: Mapping[ProcessIdentity, Ending],
    boot_id: str,
    began: float,
) -> None:
    """A line for each target the sweep itself ended (signals sent, none recorded)."""
    for result in results:
        recorded = latest.get(result.target)
        if result.ended is None or not result.signals:
            continue
        if recorded is not None and recorded.event == "ended":
            continue
        why = "the sweep's SIGKILL" if "SIGKILL" in result.signals else "the sweep's SIGTERM"
        endings.append(
            path,
            Ending(
                event="ended",
                pid=result.target.pid,
                started=result.target.started,
                boot_id=boot_id,
                at=time.time(),
                by="sweep",
                how=result.ended,
                after_seconds=time.monotonic() - began,
                why=why,
            ),
        )
