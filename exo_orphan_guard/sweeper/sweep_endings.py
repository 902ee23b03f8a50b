"""How each judged target is to be ended (`plan`, pure), and the ledger a sweeper
keeps of its endings in `endings.jsonl` (`Ledger`): what it has begun, so that no
other sweeper signals the same runner again, and how each ended, for `doctor`. What
it has begun goes to the user's `begun_record` too, which every sweeper reads beside
its registry's lines: it is one per user and machine, whatever registry the
environment names.

The guardian, the CLI's sweep and exo's worker hook all plan with `plan` and write
with a `Ledger`; `engine.end` does what lies between.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from ..records import endings
from ..records.begun_record import BegunRecord
from ..records.endings import By, Ending, EndSignal, How, Step
from ..system.identity import ProcessIdentity
from ..system.settings import WEDGE_SECONDS
from .engine import FirstStep, KillResult, Target
from .verdicts import Verdict

_HANDED_OVER: Final = "its worker's hooks hand it exo's own Shutdown"


@final
@dataclass(frozen=True, slots=True)
class Bounds:
    """How long each step may take, in seconds."""

    grace: float
    """From SIGTERM to SIGKILL."""
    interrupt_wait: float
    """From SIGINT to SIGKILL, for an exo runner: the busy wait (it may be in native
    code, taking SIGINT when its call returns), never less than the grace."""
    kill_wait: float
    """From SIGKILL until a process still there is reported stuck in the kernel."""


def first_step(verdict: Verdict, bounds: Bounds) -> FirstStep:
    """An exo runner (the fingerprint rule): SIGINT, then the busy wait, since it has
    no handler of its own and KeyboardInterrupt unwinds it through Python, where
    SIGTERM's default action runs none; unless it ignores SIGINT (nothing then ends it
    the clean way from outside: waiting out the busy wait would only delay the kill).
    Everything else: SIGTERM (a guarded runner's handler asks for its clean ending),
    then the grace."""
    process = verdict.process
    if verdict.rule == "fingerprint" and process is not None and process.ignores_sigint is not True:
        return FirstStep("SIGINT", bounds.interrupt_wait)
    return FirstStep("SIGTERM", bounds.grace)


def plan(
    verdicts: Sequence[Verdict],
    latest: Mapping[ProcessIdentity, Ending],
    now: float,
    bounds: Bounds,
    *,
    wait_for_endings: bool = True,
    handed: Collection[ProcessIdentity] = (),
    handover_wait: float = 0.0,
) -> list[Target]:
    """Each target of `verdicts` with its first step and, if it is ending by itself,
    until when it is left alone: a recorded runner whose clean ending has not ended,
    one another sweeper has begun to end (`patience`; not with `wait_for_endings`
    False, `sweep --now`), and one of `handed` (runners whose worker's hooks hand them
    exo's own Shutdown) for `handover_wait`: a SIGINT would cut exo's own
    `Runner.shutdown` short."""
    waits = patience(verdicts, latest, now) if wait_for_endings else {}
    targets: list[Target] = []
    for verdict in verdicts:
        if verdict.action != "kill" or verdict.process is None:
            continue
        identity = verdict.process.identity
        until = waits.get(identity)
        if until is None and identity in handed and handover_wait > 0:
            until = now + handover_wait
        targets.append(Target(identity, first_step(verdict, bounds), until))
    return targets


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
        elif ending is not None and ending.event == "begun" and ending.why == _HANDED_OVER:
            why = _HANDED_OVER
        elif ending is not None and ending.event == "begun" and ending.by in ("sweep", "guardian"):
            why = f"the {ending.by} has begun to end it"
        elif ending is not None and ending.event == "begun":
            why = "its worker is gone and its clean ending has begun"
        elif verdict.record is None:
            why = _HANDED_OVER
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


@final
class Ledger:
    """A sweeper's lines in `endings.jsonl` (none without a registry directory), and
    what it says of its waits (`on_wait`)."""

    def __init__(
        self,
        directory: Path | None,
        boot_id: str,
        by: By,
        verdicts: Sequence[Verdict],
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self._path = None if directory is None else directory / endings.ENDINGS_NAME
        self._boot_id = boot_id
        self._by: By = by
        self._verdicts = verdicts
        self._on_wait = on_wait
        self._record = BegunRecord()
        self._targets = frozenset(verdict.pid for verdict in verdicts if verdict.action == "kill")
        """What this ledger is asked about: only their lines are read."""
        self.began = time.monotonic()

    def latest(self) -> dict[ProcessIdentity, Ending]:
        """The newest word on each runner, from the registry and the user's record of
        begun endings, in the order they were written."""
        here = [] if self._path is None else endings.read(self._path, self._boot_id, self._targets)
        begun = self._record.read(self._boot_id)
        return endings.latest(sorted((*here, *begun), key=lambda ending: ending.at))

    def leaving_alone(
        self,
        targets: Sequence[Target],
        latest: Mapping[ProcessIdentity, Ending],
        handed: Collection[ProcessIdentity] = (),
    ) -> None:
        """Say which targets are left alone, why and until when; a `begun` line for
        each of `handed` left alone with nothing recorded of it yet, so that another
        sweeper finding it meanwhile waits too."""
        now = time.monotonic()
        waits = {t.identity: t.left_alone_until for t in targets if t.left_alone_until}
        shown = dict(latest)
        for identity, until in waits.items():
            if identity in handed and identity not in latest:
                shown[identity] = self._line(identity, until, _HANDED_OVER)
                self._write_begun(shown[identity])
        if self._on_wait is not None:
            for line in wait_lines(self._verdicts, waits, shown, now, time.time()):
                self._on_wait(line)

    def begun(self, target: Target, deadline: float) -> None:
        """A `begun` line as a SIGINT goes out, with the deadline of its SIGKILL:
        another sweeper that finds the runner meanwhile waits for it instead of
        signalling it again (`patience`)."""
        if target.first.signal == "SIGINT":
            why = f"the {self._by}'s SIGINT; SIGKILL at the deadline if it is still there"
            self._begun(target.identity, deadline, why)

    def renew(self, target: ProcessIdentity) -> float | None:
        """A deadline out: wait on if the watchdog has since recorded a later one (a
        runner busy in native code is recorded so 0.5 s after the notice)."""
        recorded = self.latest().get(target)
        now = time.monotonic()
        later = endings.recorded_deadline(recorded, now)
        if later is not None and self._on_wait is not None and recorded is not None:
            for line in wait_lines(
                self._verdicts, {target: later}, {target: recorded}, now, time.time()
            ):
                self._on_wait(line)
        return later

    def ended(self, results: Sequence[KillResult]) -> list[KillResult]:
        """Each result with how it ended (`with_endings`), and a line for each target
        this sweeper ended itself (signals sent, no ending recorded by its watchdog)."""
        latest = self.latest()
        ended = with_endings(results, self._verdicts, latest)
        if self._path is None:
            return ended
        for result in ended:
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
                self._path,
                Ending(
                    event="ended",
                    pid=result.target.pid,
                    started=result.target.started,
                    boot_id=self._boot_id,
                    at=time.time(),
                    by=self._by,
                    how=result.ended,
                    after_seconds=time.monotonic() - self.began,
                    why=f"the {self._by}'s {sent}",
                    step=ended_step(result.signals),
                    signal=sent,
                ),
            )
        return ended

    def _begun(self, identity: ProcessIdentity, deadline: float, why: str) -> None:
        self._write_begun(self._line(identity, deadline, why))

    def _write_begun(self, line: Ending) -> None:
        if self._path is not None:
            endings.append(self._path, line)
        self._record.append(line)

    def _line(self, identity: ProcessIdentity, deadline: float, why: str) -> Ending:
        return Ending(
            event="begun",
            pid=identity.pid,
            started=identity.started,
            boot_id=self._boot_id,
            at=time.time(),
            by=self._by,
            why=why,
            deadline=deadline,
        )
