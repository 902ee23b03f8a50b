"""Kill escalation: a first signal to each orphan and its descendants, a wait, SIGKILL.

The first step is each target's own (`FirstStep`): SIGINT and the busy wait for an
unguarded exo runner (KeyboardInterrupt unwinds it through Python; one in native code
takes it when its call returns), SIGTERM and the grace for the rest; a wait of 0 is
SIGKILL at once. Each target is killed at its own deadline, not at the last one's.

A guarded runner that is ending the clean way by itself (its worker gone, within its
grace, or busy in native code within its busy wait) is waited for first, untouched:
no stop, no signal, until its deadline, and past it for as long as its watchdog has
since recorded a later one, or until the sweep is told to stop (exo cancelled the
task that awaits it): then it is left, as it is, to its watchdog.

Each orphan's tree is frozen (SIGSTOP) before it is read, so no process can fork a
child behind the sweep's back, and frozen again before SIGKILL: an orphan still
starting up may be spawning a child at the very moment it is found. Every stop is
journaled first and undone however the sweep ends (`freeze_journal`).

A process still there after SIGKILL is stuck in the kernel: Linux state D, or macOS
state U (ranks in the RDMA driver), which only a reboot ends. It is reported, with
that advice, never waited on forever. Zombies are gone: they hold no memory.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, final

from .. import system
from ..records.endings import How
from ..records.freeze_journal import FreezeJournal
from ..system.identity import ProcessIdentity, identity_of, liveness
from ..system.process_facts import Pid
from .process_table import is_guard_command

SignalSender = Callable[[int, int], None]
Renewal = Callable[[ProcessIdentity], float | None]
"""A later deadline for a waited-for target whose deadline is out, or None."""
send_signal: SignalSender = os.kill
"""The effect handler that delivers signals; tests swap it to make a survivor."""

Outcome = Literal["killed", "exited", "unkillable"]
FirstSignal = Literal["SIGINT", "SIGTERM"]
_NUMBERS: Final[Mapping[str, int]] = {
    "SIGINT": signal.SIGINT,
    "SIGTERM": signal.SIGTERM,
    "SIGKILL": signal.SIGKILL,
}
REBOOT_ADVICE: Final = (
    "it survived SIGKILL, stuck in the kernel; only a reboot frees its memory and RDMA resources"
)
_WAIT_STEP_SECONDS: Final = 0.01


@final
@dataclass(frozen=True, slots=True)
class FirstStep:
    """What a target gets first, and how long it then has before SIGKILL."""

    signal: FirstSignal
    seconds: float
    """0: no first signal, SIGKILL at once."""


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
    """clean: it exited by itself (a guarded runner's clean ending, the sweep's SIGTERM
    to one included, or an exo runner unwound by SIGINT); killed: SIGKILL, or SIGTERM's
    default action; None: still there."""

    @property
    def advice(self) -> str | None:
        return REBOOT_ADVICE if self.outcome == "unkillable" else None

    @property
    def last_signal(self) -> str | None:
        """The signal it was gone after: the last one sent (None: none was needed)."""
        return self.signals[-1] if self.outcome != "unkillable" and self.signals else None


@final
class _Family:
    """A target and every descendant found so far that it may signal."""

    def __init__(self, target: ProcessIdentity, step: FirstStep) -> None:
        self.target = target
        self.step = step
        self.uid = system.effective_uid(target.pid)
        self.members: list[ProcessIdentity] = [target]
        self.sent: list[str] = []


@final
class _Freezer:
    """Stops members, each written to the journal first; none without a journal."""

    def __init__(self, journal: FreezeJournal | None) -> None:
        self._journal = journal
        self._stopped: list[ProcessIdentity] = []

    def stop(self, member: ProcessIdentity) -> None:
        if self._journal is None or member in self._stopped or not self._journal.add(member):
            return
        self._stopped.append(member)  # before the signal: whatever interrupts it, undo it
        _send(member, signal.SIGSTOP)

    def release(self) -> None:
        """Continue whatever is stopped and still there, however `execute` ended."""
        for member in self._stopped:
            _send(member, signal.SIGCONT)


def execute(
    targets: Sequence[ProcessIdentity],
    protected: Collection[int],
    steps: Mapping[ProcessIdentity, FirstStep],
    kill_wait: float,
    journal: FreezeJournal | None,
    patience: Mapping[ProcessIdentity, float] | None = None,
    renew: Renewal | None = None,
    stop: threading.Event | None = None,
) -> list[KillResult]:
    """End each target and its descendants: its first step (`steps`), then SIGKILL at
    that step's deadline if anything is left. With a `journal`, each tree is frozen
    while it is read; without one nothing is ever stopped (a sweeper that died would
    leave it stopped), and the tree is read again right before SIGKILL instead.
    `patience`: targets ending by themselves, each with the `time.monotonic()` it is
    left alone until (gone by then, it is `exited`); the others are dealt with first.
    `renew`: asked, as each deadline runs out, for a later one. `stop`, once set, ends
    the wait for them: those still there get no result, and nothing is sent them."""
    waiting = {target: patience[target] for target in targets if patience and target in patience}
    # A target is never taken for another one's descendant, in either batch.
    reserved = {*protected, *(target.pid for target in targets)}
    at_once = [target for target in targets if target not in waiting]
    results = _escalate(at_once, reserved, steps, kill_wait, journal)
    if waiting:
        left = _wait_for_clean_endings(waiting, renew, stop)
        waited = [target for target in waiting if target not in left]
        results += _escalate(waited, reserved, steps, kill_wait, journal)
    order = {target: index for index, target in enumerate(targets)}
    return sorted(results, key=lambda result: order[result.target])


def _escalate(
    targets: Sequence[ProcessIdentity],
    protected: Collection[int],
    steps: Mapping[ProcessIdentity, FirstStep],
    kill_wait: float,
    journal: FreezeJournal | None,
) -> list[KillResult]:
    if not targets:
        return []
    families = [_Family(target, steps[target]) for target in targets]
    claimed: set[int] = {target.pid for target in targets} | set(protected)
    freezer = _Freezer(journal)
    try:
        _gather(families, claimed, freezer)
        waited = [family for family in families if family.step.seconds > 0]
        for family in waited:
            _signal([family], _NUMBERS[family.step.signal], family.step.signal)
        _signal(waited, signal.SIGCONT, None)  # a stopped process acts on it once continued
        killed = [family for family in families if family.step.seconds <= 0]
        _kill(killed, claimed, freezer)
        began = time.monotonic()
        while waited:
            waited = [family for family in waited if not _gone(family)]
            due = [f for f in waited if time.monotonic() >= began + f.step.seconds]
            if due:
                _kill(due, claimed, freezer)
                killed += due
                waited = [family for family in waited if family not in due]
            if waited:
                time.sleep(_WAIT_STEP_SECONDS)
        _wait_until_gone(killed, kill_wait)
    finally:
        freezer.release()
    return [_result(family) for family in families]


def _kill(families: Sequence[_Family], claimed: set[int], freezer: _Freezer) -> None:
    """SIGKILL, each tree read again first (frozen, if journaled): an orphan still
    starting up may have forked meanwhile."""
    if families:
        _gather(families, claimed, freezer)
        _signal(families, signal.SIGKILL, "SIGKILL")


def _gone(family: _Family) -> bool:
    return all(liveness(member) == "gone" for member in family.members)


def preview(
    targets: Sequence[ProcessIdentity], protected: Collection[int]
) -> dict[Pid, tuple[Pid, ...]]:
    """What `execute` would signal besides each target (its descendants), signalling
    nothing: what `scan` and `--dry-run` list."""
    families = [_Family(target, FirstStep("SIGTERM", 0.0)) for target in targets]
    _gather(families, {target.pid for target in targets} | set(protected), _Freezer(None))
    return {
        family.target.pid: tuple(member.pid for member in family.members[1:]) for family in families
    }


def _gather(families: Sequence[_Family], claimed: set[int], freezer: _Freezer) -> None:
    """Stop every member (if journaled), then look for new descendants, until none
    appear. A descendant is taken only if it has the target's user and is not another
    exo-orphan-guard process."""
    while True:
        for family in families:
            for member in family.members:
                freezer.stop(member)
        grew = False
        for family in families:
            for member in list(family.members):
                for pid in system.child_pids(member.pid):
                    if pid in claimed or not _may_signal(pid, family.uid):
                        continue
                    child = identity_of(pid)
                    if child is not None:
                        claimed.add(pid)
                        family.members.append(child)
                        grew = True
        if not grew:
            return


def _signal(families: Sequence[_Family], number: int, name: str | None) -> None:
    for family in families:
        for member in family.members:
            if _send(member, number) and name is not None and member == family.target:
                family.sent.append(name)


def _send(member: ProcessIdentity, number: int) -> bool:
    # Re-checked right before each signal: the pid may have been reused since.
    if liveness(member) != "alive":
        return False
    try:
        send_signal(member.pid, number)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_for_clean_endings(
    patience: Mapping[ProcessIdentity, float], renew: Renewal | None, stop: threading.Event | None
) -> set[ProcessIdentity]:
    """Wait until each target is gone or out of time; those still waited for when
    `stop` is set are returned."""
    stop = stop or threading.Event()  # never set: a plain pause
    pending = dict(patience)
    while pending:
        now = time.monotonic()
        for target, deadline in list(pending.items()):
            later = renew(target) if deadline <= now and renew is not None else None
            if liveness(target) == "gone" or (deadline <= now and (later or now) <= now):
                del pending[target]
            elif later is not None:
                pending[target] = later
        if pending and stop.wait(_WAIT_STEP_SECONDS):
            return set(pending)
    return set()


def _wait_until_gone(families: Sequence[_Family], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    pending = [member for family in families for member in family.members]
    while pending:
        pending = [member for member in pending if liveness(member) != "gone"]
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(_WAIT_STEP_SECONDS)


def _result(family: _Family) -> KillResult:
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


def _may_signal(pid: int, uid: int | None) -> bool:
    if uid is None:
        return False
    found = system.owner_and_argv(pid)
    return found is not None and found[0] == uid and not is_guard_command(found[1])
