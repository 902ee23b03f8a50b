"""How the guardian ends the runners of an exo that died: judged as a sweep judges
them (every never-kill rule holds), planned as a sweep plans them, ended by the same
engine, without the registry's lock.

A runner is claimed by one of the guardian's endings at a time (`Claims`), each ending
in a thread of its own, so that a busy runner's wait never delays another exo's. A
runner whose worker's hooks hand it exo's own Shutdown (`handed`) is left alone for
the grace first, and a `begun` line says so, so that no sweeper's SIGINT (a new exo's
start-up sweep, say) cuts exo's own `Runner.shutdown` short.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Final, final

from ..records.registry import Registry
from ..sweeper import engine
from ..sweeper.engine import KillResult, Target
from ..sweeper.judging import judge
from ..sweeper.sweep_endings import Bounds, Ledger, plan
from ..sweeper.verdicts import SweepOptions, Verdict
from ..system import settings
from ..system.identity import ProcessIdentity
from .stuck import StuckRunners

KILL_WAIT_SECONDS: Final = 2.0
OPTIONS: Final = SweepOptions(fingerprint=True)


@final
class Claims:
    """The targets the guardian's endings have taken, each by one ending at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: set[ProcessIdentity] = set()

    def take(self, targets: Sequence[Target]) -> list[Target]:
        """Those of `targets` no other ending has: now this one's."""
        with self._lock:
            free = [target for target in targets if target.identity not in self._taken]
            self._taken.update(target.identity for target in free)
        return free

    def release(self, targets: Sequence[Target]) -> None:
        with self._lock:
            self._taken.difference_update(target.identity for target in targets)

    def taken(self) -> frozenset[ProcessIdentity]:
        with self._lock:
            return frozenset(self._taken)


def end_runners(
    candidates: Collection[int] | None,
    why: str,
    *,
    bounds: Bounds,
    claims: Claims,
    handed: Callable[[Sequence[Verdict]], Collection[ProcessIdentity]],
    stuck: StuckRunners,
    stop: threading.Event,
    say: Callable[[str], None],
) -> None:
    """End what the verdicts mark among `candidates` (None: every process), saying
    what came of each. `handed`: which of the judged targets hand themselves exo's
    own Shutdown, each left alone for the grace first. `stuck`: told of each target
    that survived SIGKILL, which is said only the first time."""
    registry, _ = Registry.open(settings.registry_dir(), create=True)
    warnings: list[str] = []
    table, verdicts = judge(registry, OPTIONS, warnings, candidates)
    directory = None if registry is None else registry.path
    ledger = Ledger(directory, table.boot_id, "guardian", verdicts, say)
    latest = ledger.latest()
    giving = handed(verdicts)
    planned = plan(
        verdicts, latest, ledger.began, bounds, handed=giving, handover_wait=bounds.grace
    )
    targets = claims.take(planned)
    try:
        for warning in warnings:
            say(f"{why}: {warning}")
        ledger.leaving_alone(targets, latest, giving)
        ended = engine.end(
            targets,
            table.protected,
            kill_wait=bounds.kill_wait,
            renew=ledger.renew,
            stop=stop,
            on_signal=ledger.begun,
        )
        for result in ledger.ended(ended):
            if result.outcome != "unkillable":
                say(f"{why}: {describe(result)}")
            elif stuck.survived(result.target, time.monotonic()):
                say(
                    f"{why}: {describe(result)} (state {result.stuck_state or 'unknown'}); "
                    "tried again ever more rarely, said again only once it is gone"
                )
    finally:
        claims.release(targets)


def describe(result: KillResult) -> str:
    if result.outcome == "unkillable":
        return f"runner {result.target.pid} survived SIGKILL: {result.advice}"
    by = result.last_signal or "no signal"
    return f"runner {result.target.pid} ended {result.ended} ({', '.join(result.signals) or by})"
