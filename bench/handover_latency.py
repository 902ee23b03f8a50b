"""exo's runners when their worker is SIGKILLed: the hand-over of exo's own Shutdown
against `WorkerGone`, side by side.

Each round starts two workers at once: one whose exo-shaped runner (`rig.exo_runner`,
guarded by the series' own hooks module alone, no package code in the runner) waits
for its next task, and one whose stand-in runner
is guarded by `guard_runner()` alone and sleeps in Python (`idle`). Their own
shutdowns take no time here (`EOG_EXO_OWN_SHUTDOWN_SECONDS=0`), so what is measured
is the guard's part: from the kill to the runner gone, the first by taking the
Shutdown handed to it, the second by `WorkerGone`. The workers are killed one after
the other in random order; the step each runner's watchdog recorded is checked.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.exo_runner import OWN_SHUTDOWN_SECONDS_ENV
from exo_orphan_guard.rig.scenario_worker import Watch
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity

from .stats import Samples

DEADLINE_SECONDS: Final = 3.0
DESCRIPTION: Final = (
    "Each round starts two workers at once: one whose exo-shaped runner "
    "(`rig.exo_runner`, guarded by the series' hooks module alone: a thread on the "
    "parent sentinel, no package code in the runner) waits for its next task, and one "
    "whose stand-in runner is guarded by `guard_runner()` alone and sleeps in Python. "
    "Their own shutdowns take no time here, so what is measured is the guard's part: "
    "from the kill to the runner gone, the first by taking the Shutdown handed to it, "
    "the second by `WorkerGone`. The workers are killed one after the other in random "
    "order; the step each runner's watchdog recorded is counted (the exo-shaped runner "
    "has no watchdog: nothing is recorded for it)."
)
ROWS: Final[dict[str, Watch]] = {
    "exo's Shutdown, handed over (exo-shaped runner, waiting for a task)": "exo",
    "WorkerGone (stand-in runner, asleep in Python)": "guard",
}


@dataclass
class HandoverResults:
    rounds: int
    cells: dict[str, Samples] = field(default_factory=dict[str, Samples])
    steps: dict[str, dict[str, int]] = field(default_factory=dict[str, dict[str, int]])


def run(rounds: int, scratch: Path) -> HandoverResults:
    results = HandoverResults(rounds)
    registry = scratch / "handover-registry"
    environment = {
        settings.GRACE_ENV: str(settings.DEFAULT_GRACE_SECONDS),
        OWN_SHUTDOWN_SECONDS_ENV: "0",
    }
    for round_number in range(rounds):
        starters = {
            row: functools.partial(
                scenarios.start_worker,
                ["exoidle"] if watch == "exo" else ["idle"],
                watch=watch,
                registry=registry,
                extra_env=environment,
            )
            for row, watch in ROWS.items()
        }
        workers = {row: start() for row, start in starters.items()}
        order = list(workers.items())
        random.shuffle(order)
        try:
            time.sleep(0.2)
            for row, worker in order:
                _measure(row, worker, registry, results)
        finally:
            for worker in workers.values():
                scenarios.cleanup(worker)
        if (round_number + 1) % 10 == 0:
            print(f"  hand-over: {round_number + 1}/{rounds} rounds", flush=True)
    return results


def _measure(
    row: str, worker: scenarios.StartedWorker, registry: Path, results: HandoverResults
) -> None:
    (runner,) = worker.runners
    killed_at = scenarios.kill_worker(worker)
    gone = scenarios.wait_gone([runner.identity], DEADLINE_SECONDS)[runner.identity]
    results.cells.setdefault(row, Samples()).add(
        None if gone is None else (gone - killed_at) * 1000
    )
    step = "none (no watchdog)" if ROWS[row] == "exo" else _step(registry, runner.identity)
    counts = results.steps.setdefault(row, {})
    counts[step] = counts.get(step, 0) + 1


def _step(registry: Path, runner: ProcessIdentity) -> str:
    path = host_directory(registry) / endings.ENDINGS_NAME
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        found = endings.latest(endings.read(path, system.boot_id())).get(runner)
        if found is not None and found.event == "ended":
            return f"{found.how} / {found.step}"
        time.sleep(0.02)
    return "not recorded"


def render(results: HandoverResults) -> str:
    lines = [
        "| runner ends by | n | p50 ms | p90 ms | p99 ms | max ms | recorded (how / step) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        samples = results.cells.get(row, Samples())
        quantiles = " | ".join(
            samples.quantile_text(q, DEADLINE_SECONDS) for q in (0.5, 0.9, 0.99, 1.0)
        )
        steps = ", ".join(f"{step}: {n}" for step, n in sorted(results.steps.get(row, {}).items()))
        lines.append(f"| {row} | {samples.count} | {quantiles} | {steps} |")
    return "\n".join(lines)
