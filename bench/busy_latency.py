"""Runners busy in native code when their worker is SIGKILLed: how soon after their
call returns they end the clean way, and when one that never returns is killed.

Each round starts, side by side, one worker per call length N (1, 2, 4 s) whose
runner makes one native call after another that lets go of the GIL, as `mx.eval`
does (`gilfree`: a `usleep` through ctypes.CDLL, every signal blocked in it, so its
return is known to the millisecond, which an eval's is not), and one worker whose
runner holds the GIL in native code that never returns (`gil`). Once every call is
under way the workers are SIGKILLed, at a random moment of the first half second.
Measured on the runner's own notes and pidfds, one monotonic clock: from the call's
return to WorkerGone on its main thread (the clean ending begun) and to the runner
gone; for the wedged runner, from the kill to gone, less the busy wait.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.system import settings

from .stats import Samples

LENGTHS: Final = (1.0, 2.0, 4.0)
BUSY_WAIT_FOR_CALLS: Final = 10.0
"""For the returning calls: longer than any of them, with margin."""
WEDGED_BUSY_WAIT: Final = 3.0
"""For the runner that never returns: it is killed at this."""
_BOUND_SECONDS: Final = 15.0
DESCRIPTION: Final = (
    "Each round starts, side by side, one worker per call length N (1, 2, 4 s) whose "
    "runner makes one native call after another that lets go of the GIL, as `mx.eval` "
    "does (a `usleep` through `ctypes.CDLL`, every signal blocked in it, so that its "
    "return is known to the millisecond, which an eval's is not), and one worker whose "
    "runner holds the GIL in native code that never returns. Once every call is under "
    "way the workers are SIGKILLed, at a random moment of the first half second. "
    "Measured on the runners' own notes and pidfds, one monotonic clock: from the "
    "call's return to `WorkerGone` on the main thread (the clean ending begun) and to "
    "the runner gone by itself; for the wedged runner, from the kill to gone, less the "
    f"busy wait ({WEDGED_BUSY_WAIT:g} s)."
)


@dataclass
class BusyResults:
    rounds: int
    begun: dict[float, Samples] = field(default_factory=dict[float, Samples])
    gone: dict[float, Samples] = field(default_factory=dict[float, Samples])
    wedged: Samples = field(default_factory=Samples)
    """Kill to gone, less the busy wait (signed, ms)."""


def run(rounds: int, registry: Path) -> BusyResults:
    results = BusyResults(rounds)
    for number in range(rounds):
        _round(results, registry / f"round-{number}")
        if (number + 1) % 10 == 0:
            print(f"  busy runners: {number + 1}/{rounds} rounds", flush=True)
    return results


def _round(results: BusyResults, scratch: Path) -> None:
    notes = scratch / "notes"
    notes.mkdir(parents=True)
    start = functools.partial(scenarios.start_worker, registry=scratch / "registry", notes=notes)
    workers = [
        start(
            ["gilfree"],
            extra_env={
                "EOG_NATIVE_SECONDS": f"{length:g}",
                settings.BUSY_WAIT_ENV: f"{BUSY_WAIT_FOR_CALLS:g}",
            },
        )
        for length in LENGTHS
    ]
    wedged = start(["gil"], extra_env={settings.BUSY_WAIT_ENV: f"{WEDGED_BUSY_WAIT:g}"})
    try:
        for worker in workers:
            _until_noted(notes, worker.runners[0].identity.pid, "native begun")
        time.sleep(max(scenarios.GIL_SETTLE_SECONDS, random.uniform(0.0, 0.5)))
        everyone = [*workers, wedged]
        killed = {id(worker): scenarios.kill_worker(worker, settle=False) for worker in everyone}
        runners = [worker.runners[0].identity for worker in everyone]
        gone = scenarios.wait_gone(runners, _BOUND_SECONDS)
        for length, worker in zip(LENGTHS, workers, strict=True):
            runner = worker.runners[0].identity
            seen = read_notes(notes, runner.pid)
            killed_at = killed[id(worker)]
            call = [n for n in seen if n["event"] == "native begun" and n["at"] < killed_at][-1]
            returned = call["at"] + length
            raised = next((n["at"] for n in seen if n["event"] == "raised"), None)
            left = gone[runner]
            results.begun.setdefault(length, Samples()).add(
                None if raised is None else (raised - returned) * 1000
            )
            results.gone.setdefault(length, Samples()).add(
                None if left is None else (left - returned) * 1000
            )
        left = gone[wedged.runners[0].identity]
        results.wedged.add(
            None if left is None else (left - killed[id(wedged)] - WEDGED_BUSY_WAIT) * 1000
        )
    finally:
        for worker in [*workers, wedged]:
            scenarios.cleanup(worker)


def _until_noted(notes: Path, pid: int, event: str) -> None:
    deadline = time.monotonic() + 60.0
    while not any(note["event"] == event for note in read_notes(notes, pid)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"runner {pid} never noted {event!r}")
        time.sleep(0.01)


def render(results: BusyResults) -> str:
    lines = [
        "| runner | measured from | to | trials | p50 ms | p99 ms | max ms |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for length in LENGTHS:
        for what, samples in (
            ("WorkerGone raised (clean ending begun)", results.begun.get(length, Samples())),
            ("gone by itself", results.gone.get(length, Samples())),
        ):
            lines.append(
                f"| inside a {length:g} s native call, GIL let go | its return | {what} | "
                f"{samples.count} | {samples.quantile_text(0.50, _BOUND_SECONDS)} | "
                f"{samples.quantile_text(0.99, _BOUND_SECONDS)} | "
                f"{samples.quantile_text(1.0, _BOUND_SECONDS)} |"
            )
    wedged = results.wedged
    lines.append(
        f"| GIL held in native code, never returning | the kill + the busy wait "
        f"({WEDGED_BUSY_WAIT:g} s) | killed | {wedged.count} | "
        f"{_signed(wedged.quantile(0.50))} | {_signed(wedged.quantile(0.99))} | "
        f"{_signed(wedged.quantile(1.0))} |"
    )
    minimum = min((v for v in wedged.values if v is not None), default=None)
    lines.append(
        f"\nThe wedged runner's earliest kill: {_signed(minimum)} ms from the busy wait "
        "(negative: before it)."
    )
    return "\n".join(lines)


def _signed(value: float | None) -> str:
    return "alive" if value is None else f"{value:+.1f}"
