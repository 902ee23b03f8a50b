"""What a sweep makes of endings: which first step each target gets, it waits for
runners ending cleanly (or being ended by another sweeper), says how each orphan it
ended went, and writes that down for `doctor`.

All but `write` and `write_begun` are pure (records and endings in, steps, deadlines
and labels out).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from ..records import endings
from ..records.endings import By, Ending, EndSignal, How, Step
from ..system.identity import ProcessIdentity
from ..system.settings import WEDGE_SECONDS
from .killing import FirstStep, KillResult
from .verdicts import Verdict


def first_steps(
    verdicts: Sequence[Verdict], grace: float, interrupt_wait: float | None
) -> dict[ProcessIdentity, FirstStep]:
    """What each target gets first. An unrecorded exo runner (the fingerprint rule):
    SIGINT, then `interrupt_wait` (the busy wait) when given, since it has no handler
    of its own and KeyboardInterrupt unwinds it through Python, where SIGTERM's
    default action runs none; unless it ignores SIGINT (nothing then ends it the
    clean way from outside: waiting out the busy wait would only delay the kill).
    Everything else: SIGTERM (a guarded runner's handler asks for its clean ending),
    then the grace."""
    steps: dict[ProcessIdentity, FirstStep] = {}
    for verdict in verdicts:
        if verdict.action != "kill" or verdict.process is None:
            continue
        takes_sigint = verdict.process.ignores_sigint is not True
        if interrupt_wait is not None and verdict.rule == "fingerprint" and takes_sigint:
            steps[verdict.process.identity] = FirstStep("SIGINT", interrupt_wait)
        else:
            steps[verdict.process.identity] = FirstStep("SIGTERM", grace)
    return steps


def handed_over(
    verdicts: Sequence[Verdict],
    targets: Collection[ProcessIdentity],
    waits: Mapping[ProcessIdentity, float],
) -> list[ProcessIdentity]:
    """Targets that end by themselves if left alone: unrecorded exo runners (the
    fingerprint rule) of a worker whose hooks hand them their Shutdown, not already
    waited for."""
    return [
        verdict.process.identity
        for verdict in verdicts
        if verdict.action == "kill"
        and verdict.rule == "fingerprint"
        and verdict.process is not None
        and verdict.process.identity in targets
        and verdict.process.identity not in waits
    ]


def patience(
    verdicts: Sequence[Verdict], latest: Mapping[ProcessIdentity, Ending], now: float
) -> dict[ProcessIdentity, float]:
    """Targets to leave alone, each until its deadline (`time.monotonic()`): recorded
    runners with a clean ending that has not ended yet, and any target another
    sweeper (the guardian, a sweep) has begun to end, until its deadline: a second
    SIGINT would cut short the unwinding the first one began."""
    waits: dict[ProcessIdentity, float] = {}
    for verdict in verdicts:
        if verdict.action != "kill" or verdict.process is None:
            continue
        ending = latest.get(verdict.process.identity)
        if verdict.record is None and ending is not None and ending.by in ("sweep", "guardian"):
            deadline = endings.recorded_deadline(ending, now)
            if deadline is not None:
                waits[verdict.process.identity] = deadline
            continue
        if verdict.rule != "registry" or verdict.record is None:
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
        if verdict.process is None or verdict.process.identity not in waits:
            continue
        target = verdict.process.identity
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
        elif ending is not None and ending.event == "begun" and ending.by in ("sweep", "guardian"):
            why = f"the {ending.by} has begun to end it"
        elif ending is not None and ending.event == "begun":
            why = "its worker is gone and its clean ending has begun"
        elif verdict.record is None:
            why = "its worker's hooks hand it exo's own Shutdown"
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
    the clean ending); anyone else's default action for it is a kill. SIGINT unwinds
    an exo runner through Python: gone without SIGKILL, it ended clean."""
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
        elif "SIGKILL" in result.signals:
            how = "killed"
        elif "SIGINT" in result.signals:
            how = "clean"
        elif result.target not in guarded:
            how = "killed"
        else:
            how = "clean"
        ended.append(dataclasses.replace(result, ended=how))
    return ended


def ended_step(signals: Sequence[str]) -> Step | None:
    """Which step ended a target, from the signals sent to it."""
    match tuple(signals):
        case ("SIGINT",):
            return "interrupt"
        case ("SIGINT", "SIGKILL"):
            return "busy_wait"
        case ("SIGTERM", "SIGKILL"):
            return "grace"
        case ("SIGKILL",):
            return "at_once"
        case _:
            return None


def write(
    path: Path,
    results: Sequence[KillResult],
    latest: Mapping[ProcessIdentity, Ending],
    boot_id: str,
    began: float,
    by: By = "sweep",
) -> None:
    """A line for each target the sweep itself ended (signals sent, none recorded)."""
    for result in results:
        recorded = latest.get(result.target)
        last = result.last_signal
        if result.ended is None or last is None:
            continue
        if recorded is not None and recorded.event == "ended":
            continue
        sent: EndSignal = (
            "SIGKILL" if last == "SIGKILL" else "SIGINT" if last == "SIGINT" else "SIGTERM"
        )
        endings.append(
            path,
            Ending(
                event="ended",
                pid=result.target.pid,
                started=result.target.started,
                boot_id=boot_id,
                at=time.time(),
                by=by,
                how=result.ended,
                after_seconds=time.monotonic() - began,
                why=f"the {by}'s {sent}",
                step=ended_step(result.signals),
                signal=sent,
            ),
        )


def write_begun(
    path: Path,
    steps: Mapping[ProcessIdentity, FirstStep],
    boot_id: str,
    by: By,
) -> None:
    """A `begun` line for each target about to get SIGINT, with the deadline of its
    wait: another sweeper that finds it meanwhile waits for it instead of signalling
    it again (`patience`)."""
    now = time.monotonic()
    for target, step in steps.items():
        if step.signal != "SIGINT" or step.seconds <= 0:
            continue
        endings.append(
            path,
            Ending(
                event="begun",
                pid=target.pid,
                started=target.started,
                boot_id=boot_id,
                at=time.time(),
                by=by,
                why=f"the {by}'s SIGINT; SIGKILL at the deadline if it is still there",
                deadline=now + step.seconds,
            ),
        )
