"""The grace's floor: an idle runner's clean ending against `MIN_GRACE_SECONDS`, as the
machine gets busier.

A grace above 0 but below the floor (`EXO_ORPHAN_GUARD_GRACE=0.0001`) is raised to it,
so that a clean ending that has begun is not killed half-way. Whether an idle runner's
ending then fits depends on how much CPU its exit gets: most of it is the interpreter's
own teardown, after the runner's code is done. This measures it beside a chosen number
of busy loops on the machine's cores, the load `make test` put beside
`tests/test_clean_ending.py` when test_chaos ran in two more passes than it should
(about 20 runnable processes on 2 cores). The suite checks only what cannot fail by
chance: the floor is what the runner is guarded with, and a runner killed at it was
given all of it.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity

from .stats import Samples

TINY_GRACE: Final = "0.0001"
LOADS: Final = (0, 4, 16)
"""Busy loops beside each round: none, two per core, eight per core (on 2 cores)."""
BACKENDS: Final[dict[str, dict[str, str]]] = {
    "linux": {},
    "portable": {settings.BACKEND_ENV: "portable"},
}
ROUNDS_PER_BLOCK: Final = 5
"""Rounds run under one load before the next load's: the loads take turns in blocks, in
random order, so that what else the machine does falls on each alike."""
_GONE_BOUND_SECONDS: Final = 5.0
_RECORDED_BOUND_SECONDS: Final = 2.0
_BUSY_LOOP: Final = ("/bin/sh", "-c", "while :; do :; done")
DESCRIPTION: Final = (
    "Each round starts a worker with one idle runner guarded with "
    f"`EXO_ORPHAN_GUARD_GRACE={TINY_GRACE}` (raised to the floor, "
    f"{settings.MIN_GRACE_SECONDS:g} s), SIGKILLs it, and measures on one monotonic "
    "clock from the runner's `WorkerGone` (its own note: the clean ending begun) to the "
    "runner gone (its pidfd readable, as the benchmark sees it), and reads how its "
    "watchdog recorded the ending: clean, or killed at the floor. Beside the rounds run "
    "N busy loops (`while :; do :; done` in sh), started before and stopped after each "
    f"block of {ROUNDS_PER_BLOCK} rounds; the loads take turns in random order, and the "
    "two backends alternate within a block."
)


@dataclass
class FloorResults:
    rounds: int
    cores: int
    gone: dict[tuple[str, int], Samples] = field(default_factory=dict[tuple[str, int], Samples])
    """Per backend and load: the runner's WorkerGone to the runner gone, ms."""
    how: dict[tuple[str, int], dict[str, int]] = field(
        default_factory=dict[tuple[str, int], dict[str, int]]
    )


def run(rounds: int, scratch: Path) -> FloorResults:
    results = FloorResults(rounds, os.cpu_count() or 1)
    blocks = max(1, rounds // ROUNDS_PER_BLOCK)
    for block in range(blocks):
        for load in random.sample(LOADS, len(LOADS)):
            with _busy_loops(load):
                for index in range(ROUNDS_PER_BLOCK):
                    for backend in random.sample(list(BACKENDS), len(BACKENDS)):
                        directory = scratch / f"{block}-{load}-{index}-{backend}"
                        _measure(backend, load, directory, results)
        print(f"  floor: {(block + 1) * ROUNDS_PER_BLOCK}/{rounds} rounds", flush=True)
    return results


@contextlib.contextmanager
def _busy_loops(count: int) -> Generator[None]:
    loops = [
        subprocess.Popen(_BUSY_LOOP, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        time.sleep(0.2)  # every loop running before the first round
        yield
    finally:
        for loop in loops:  # each one this process started, by its own handle
            loop.kill()
            loop.wait()


def _measure(backend: str, load: int, directory: Path, results: FloorResults) -> None:
    registry, notes = directory / "registry", directory / "notes"
    notes.mkdir(parents=True)
    environment = {settings.GRACE_ENV: TINY_GRACE, **BACKENDS[backend]}
    worker = scenarios.start_worker(["idle"], registry=registry, extra_env=environment, notes=notes)
    try:
        (runner,) = worker.runners
        scenarios.kill_worker(worker)
        gone = scenarios.wait_gone([runner.identity], _GONE_BOUND_SECONDS)[runner.identity]
        raised = [note["at"] for note in read_notes(notes, runner.identity.pid)][:1]
        cell = results.gone.setdefault((backend, load), Samples())
        cell.add(None if gone is None or not raised else (gone - float(raised[0])) * 1000)
        how = _recorded(registry, runner.identity)
        counts = results.how.setdefault((backend, load), {})
        counts[how] = counts.get(how, 0) + 1
    finally:
        scenarios.cleanup(worker)


def _recorded(registry: Path, runner: ProcessIdentity) -> str:
    path = host_directory(registry) / endings.ENDINGS_NAME
    deadline = time.monotonic() + _RECORDED_BOUND_SECONDS
    while time.monotonic() < deadline:
        found = endings.latest(endings.read(path, system.boot_id())).get(runner)
        if found is not None and found.event == "ended":
            return "clean" if found.how == "clean" else f"{found.how} ({found.step})"
        time.sleep(0.02)
    return "not recorded"


def render(results: FloorResults, loads: Sequence[int] = LOADS) -> str:
    lines = [
        "| backend | busy loops | per core | n | p50 ms | p90 ms | p99 ms | max ms | recorded |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for backend in BACKENDS:
        for load in loads:
            samples = results.gone.get((backend, load), Samples())
            quantiles = " | ".join(
                samples.quantile_text(q, _GONE_BOUND_SECONDS) for q in (0.5, 0.9, 0.99, 1.0)
            )
            how = ", ".join(
                f"{name}: {n}" for name, n in sorted(results.how.get((backend, load), {}).items())
            )
            per_core = f"{load / results.cores:g}"
            lines.append(
                f"| {backend} | {load} | {per_core} | {samples.count} | {quantiles} | {how} |"
            )
    return "\n".join(lines)
