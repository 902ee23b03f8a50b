"""One way to end a process: identity, signal, wait, escalate, record.

The guardian, the CLI's sweep and exo's worker hook all end what they judged through
`end`. Each target comes with its plan (`Target`, decided by `sweep_endings.plan`):
the first signal it gets, how long it then has before SIGKILL, and until when it is
left alone first because it is ending by itself. On its own clock, each target:

1. is left alone until its deadline (which `renew` may move later: its watchdog
   recorded a later one) or until `stop` is set, when it is left as it is, untouched;
2. has its family proven: the descendants of the live target, each taken only once
   its parent, read after its identity, is a member still alive (a walk of a target
   that has exited would be a walk of whatever took its pid);
3. gets its first signal, with its family: SIGINT to its main thread, never while it
   is stopped (`signalling.interrupt`), or SIGTERM; every signal goes to an identity,
   never to a bare pid (`signalling.send`);
4. is waited for until it and its family are gone or the step's seconds are out;
5. gets SIGKILL with its family, proven again first (and frozen while they are read,
   with a journal: an orphan still starting up may be forking);
6. is waited for `kill_wait` more (longer while what is left is still on its way
   out, not stuck in the kernel), then reported: gone, or stuck in the kernel.

What to do next for a target is `advance`, a pure function of where its ending stands
and what was seen; `end` only reads the process table and sends the signals.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final, Literal, final

from .. import system
from ..records.endings import How
from ..records.freeze_journal import FreezeJournal
from ..system import signalling
from ..system.identity import ProcessIdentity, liveness
from ..system.process_facts import Pid
from .family import Family, Freezer, prove

Renewal = Callable[[ProcessIdentity], float | None]
"""A later deadline for a target left alone whose deadline is out, or None."""
Outcome = Literal["killed", "exited", "unkillable"]
FirstSignal = Literal["SIGINT", "SIGTERM"]
REBOOT_ADVICE: Final = (
    "it survived SIGKILL, stuck in the kernel; only a reboot frees its memory and RDMA resources"
)
_STEP_SECONDS: Final = 0.01
EXIT_SETTLE_SECONDS: Final = 30.0
"""How much longer than `kill_wait` a SIGKILLed process that is not stuck in the kernel
is waited for: on a loaded machine, tearing a large process down took over 2 s (seen
at load 37 on 2 cores), and "only a reboot frees it" would be a false alarm."""


@final
@dataclass(frozen=True, slots=True)
class FirstStep:
    """What a target gets first, and how long it then has before SIGKILL."""

    signal: FirstSignal
    seconds: float
    """0: no first signal, SIGKILL at once."""


@final
@dataclass(frozen=True, slots=True)
class Target:
    """A judged process and how it is to be ended."""

    identity: ProcessIdentity
    first: FirstStep
    left_alone_until: float | None = None
    """`time.monotonic()` until which it is ending by itself and gets no signal."""


@final
@dataclass(frozen=True, slots=True)
class KillResult:
    target: ProcessIdentity
    outcome: Outcome
    """killed: gone after our signals; exited: gone before any was needed;
    unkillable: still there after SIGKILL."""
    signals: tuple[str, ...]
    """SIGINT or SIGTERM, and/or SIGKILL, as sent to the target (SIGSTOP/SIGCONT not
    listed)."""
    descendants: tuple[Pid, ...]
    stuck_state: str | None = None
    left: tuple[Pid, ...] = ()
    """Survivors among the target and its descendants."""
    ended: How | None = None
    """clean: it exited by itself (a guarded runner's clean ending, or an exo runner
    unwound by SIGINT); killed: SIGKILL, or SIGTERM's default action; None: still
    there."""

    @property
    def advice(self) -> str | None:
        return REBOOT_ADVICE if self.outcome == "unkillable" else None

    @property
    def last_signal(self) -> str | None:
        """The signal it was gone after: the last one sent (None: none was needed)."""
        return self.signals[-1] if self.outcome != "unkillable" and self.signals else None


# The pure half: where each target's ending stands, and what to do next.

Phase = Literal["left_alone", "signalled", "killed", "done", "left"]
Move = Literal["wait", "first_signal", "kill", "done", "leave"]


@final
@dataclass(frozen=True, slots=True)
class Progress:
    phase: Phase
    until: float
    """When the phase is out (`time.monotonic()`): the end of being left alone, the
    first step's deadline (SIGKILL then), or the end of the wait after SIGKILL."""
    delivered: bool = False
    """Whether the first signal reached the target: one that could not (a stopped
    target, continued meanwhile) is sent again until the deadline."""


def begin(target: Target, now: float) -> tuple[Progress, Move]:
    """Where a target's ending starts: left alone, or its first step at once."""
    until = target.left_alone_until
    if until is not None and until > now:
        return Progress("left_alone", until), "wait"
    return _first_step(target, now)


def advance(
    target: Target,
    progress: Progress,
    *,
    gone: bool,
    now: float,
    kill_wait: float,
    renewed: float | None = None,
    stopping: bool = False,
    exiting: bool = False,
) -> tuple[Progress, Move]:
    """The next step of one target's ending. `gone`: the target (and, once signalled,
    its family) is gone; `renewed`: a later deadline for one left alone whose deadline
    is out; `stopping`: the caller stops waiting for those left alone (they are left
    untouched), while endings already under way go on; `exiting`: what SIGKILL has not
    ended yet may be on its way out (it has SIGKILL pending, even in D: tearing down a
    large process waits there; or the backend cannot tell), so it is waited for
    `EXIT_SETTLE_SECONDS` more before it is reported unkillable."""
    match progress.phase:
        case "left_alone":
            if gone:
                return Progress("done", now), "done"
            if stopping:
                return Progress("left", now), "leave"
            if now < progress.until:
                return progress, "wait"
            if renewed is not None and renewed > now:
                return Progress("left_alone", renewed), "wait"
            return _first_step(target, now)
        case "signalled":
            if gone:
                return Progress("done", now), "done"
            if now >= progress.until:
                return Progress("killed", now + kill_wait), "kill"
            return progress, ("wait" if progress.delivered else "first_signal")
        case "killed":
            late = now >= progress.until + (EXIT_SETTLE_SECONDS if exiting else 0.0)
            if gone or late:
                return Progress("done", now), "done"
            return progress, "wait"
        case "done" | "left":
            return progress, "wait"


def _first_step(target: Target, now: float) -> tuple[Progress, Move]:
    if target.first.seconds <= 0:
        return Progress("killed", now), "kill"
    return Progress("signalled", now + target.first.seconds), "first_signal"


# The acting half.


def end(
    targets: Sequence[Target],
    protected: Collection[int],
    *,
    kill_wait: float,
    journal: FreezeJournal | None = None,
    renew: Renewal | None = None,
    stop: threading.Event | None = None,
    on_signal: Callable[[Target, float], None] | None = None,
) -> list[KillResult]:
    """End each target as its plan says (the module's docstring has the steps), each
    on its own clock, all at once. `protected`: pids never taken for a descendant.
    `renew`: asked, as a target's time alone runs out, for a later deadline. `stop`,
    once set, leaves the targets still left alone as they are (no result for them);
    what was signalled goes on to its end. `on_signal`: told each target about to get
    its first signal, with the deadline (`time.monotonic()`) of its SIGKILL."""
    stop = stop or threading.Event()
    families = {target.identity: Family(target.identity) for target in targets}
    # No target is ever taken for another one's descendant.
    claimed = {*protected, *(target.identity.pid for target in targets)}
    freezer = Freezer(journal)
    now = time.monotonic()
    progress: dict[ProcessIdentity, Progress] = {}
    moves: dict[ProcessIdentity, Move] = {}
    for target in targets:
        progress[target.identity], moves[target.identity] = begin(target, now)
    try:
        while True:
            for target in targets:
                key = target.identity
                progress[key] = _act(
                    target, progress[key], moves[key], families[key], claimed, freezer, on_signal
                )
            if all(state.phase in ("done", "left") for state in progress.values()):
                break
            # Once set, `stop` is waited on no more: a pause of its own keeps the pace.
            stopping = stop.is_set()
            if stopping:
                time.sleep(_STEP_SECONDS)
            else:
                stopping = stop.wait(_STEP_SECONDS)
            now = time.monotonic()
            for target in targets:
                key = target.identity
                state = progress[key]
                if state.phase in ("done", "left"):
                    moves[key] = "wait"
                    continue
                renewed = None
                if state.phase == "left_alone" and now >= state.until and renew is not None:
                    renewed = renew(key)
                gone = (
                    liveness(key) == "gone" if state.phase == "left_alone" else families[key].gone()
                )
                exiting = state.phase == "killed" and now >= state.until and families[key].exiting()
                progress[key], moves[key] = advance(
                    target,
                    state,
                    gone=gone,
                    now=now,
                    kill_wait=kill_wait,
                    renewed=renewed,
                    stopping=stopping,
                    exiting=exiting,
                )
    finally:
        freezer.release()
    return [
        _result(families[target.identity])
        for target in targets
        if progress[target.identity].phase == "done"
    ]


def _act(
    target: Target,
    progress: Progress,
    move: Move,
    family: Family,
    claimed: set[int],
    freezer: Freezer,
    on_signal: Callable[[Target, float], None] | None,
) -> Progress:
    """Carry out `move`; the progress, with whether the first signal got through."""
    match move:
        case "first_signal":
            if on_signal is not None and not family.announced:
                family.announced = True
                on_signal(target, progress.until)
            prove([family], claimed, Freezer(None))
            delivered = _first_signal(family, target.first.signal)
            return dataclasses.replace(progress, delivered=delivered)
        case "kill":
            # Read again, frozen (journaled): an orphan still starting up may have forked.
            prove([family], claimed, freezer)
            for member in family.members:
                if signalling.send(member, signal.SIGKILL) == "sent" and member == family.target:
                    family.sent.append("SIGKILL")
            return progress
        case "wait" | "done" | "leave":
            return progress


def _first_signal(family: Family, name: FirstSignal) -> bool:
    """The first signal to each member; whether the target's got through (or never
    can: it is gone, or refused), so that it is not sent again."""
    number = signal.SIGINT if name == "SIGINT" else signal.SIGTERM
    through = True
    for member in family.members:
        if name == "SIGINT":
            delivery = signalling.interrupt(member)
        else:
            delivery = signalling.send(member, number)
        if member != family.target:
            continue
        if delivery == "sent" and name not in family.sent:
            family.sent.append(name)
        through = delivery != "stopped"
    return through


def _result(family: Family) -> KillResult:
    left = tuple(member.pid for member in family.members if liveness(member) != "gone")
    outcome: Outcome = "unkillable" if left else "killed" if family.sent else "exited"
    stuck = next((state for pid in left if (state := system.stuck_state(pid)) is not None), None)
    return KillResult(
        target=family.target,
        outcome=outcome,
        signals=tuple(family.sent),
        descendants=tuple(member.pid for member in family.members[1:]),
        stuck_state=stuck,
        left=left,
    )
