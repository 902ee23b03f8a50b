"""Time from a worker's SIGKILL to its runners' exit, per strategy, side by side.

Each round starts one worker per strategy (an idle runner and one holding the GIL in
native code), then kills the workers one at a time in random order. Every strategy
therefore runs under the same load, in the same run. The strategies run with grace 0
(killed at once: the mechanisms alone). The clean-ending rows run `auto` with the
default grace, with a runner in a loop of MLX operations as well, and say both when
the clean ending began (the runner's WorkerGone) and when the runner was gone; they
get rounds of their own, one worker at a time, after the others (a runner in an MLX
loop keeps a core busy, which would load every other row). exo
PR 2205's 5 s getppid() poll and no guard at all are measured alongside, on workers
with ten runners of each kind (their five-second waits would otherwise take hours).
The strategies of the portable backend (what macOS runs) are measured beside the
default ones, and a floor row shows how late the benchmark itself sees the worker's
exit.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from exo_orphan_guard.rig import ring_scenario, scenarios
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.rig.runner_guards import PR2205_POLL_SECONDS
from exo_orphan_guard.rig.scenario_worker import RunnerKind, Watch
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.tools import selftest

from .stats import Samples

FAST_DEADLINE_SECONDS = 1.0
SLOW_DEADLINE_SECONDS = PR2205_POLL_SECONDS + 1.0
SLOW_RUNNERS_PER_KIND = 10
SLOW_EVERY_ROUNDS = 10
MAX_RESTARTS = 10
SAMPLES_SCHEMA = "exo-orphan-guard/bench-watch-samples/1"
PORTABLE_STRATEGIES: tuple[settings.Strategy, ...] = ("auto", "watchdog", "sentinel", "poll")
PORTABLE_SUFFIX = " (portable)"
FLOOR = "floor: the worker's own exit, as the benchmark sees it"
CLEAN = ", clean ending"
BEGUN = ": begun"
CLEAN_VARIANTS = (f"auto{CLEAN}", f"auto{PORTABLE_SUFFIX}{CLEAN}")
"""Rows of runners that end the clean way (default grace); the rest run with grace 0."""
KIND_LABELS: dict[RunnerKind, str] = {
    "idle": "idle",
    "gil": "GIL held in native code",
    "mlxloop": "in a loop of MLX operations",
}


@dataclass
class Cell:
    samples: Samples = field(default_factory=Samples)
    deadline_s: float = FAST_DEADLINE_SECONDS


@dataclass
class LatencyResults:
    rounds: int
    restarts: int = 0
    """Rounds run again because one of their workers did not start."""
    cells: dict[str, dict[RunnerKind, Cell]] = field(
        default_factory=dict[str, dict[RunnerKind, Cell]]
    )

    def cell(self, name: str, kind: RunnerKind, deadline: float) -> Cell:
        return self.cells.setdefault(name, {}).setdefault(kind, Cell(deadline_s=deadline))


def run(rounds: int, registry: Path) -> LatencyResults:
    strategies = [
        *selftest.strategies_here(),
        *(f"{strategy}{PORTABLE_SUFFIX}" for strategy in PORTABLE_STRATEGIES),
    ]
    results = LatencyResults(rounds)
    slow_threads: list[threading.Thread] = []
    lock = threading.Lock()
    for round_number in range(rounds):
        if round_number % SLOW_EVERY_ROUNDS == 0:
            thread = threading.Thread(target=_slow_round, args=(results, lock, registry))
            thread.start()
            slow_threads.append(thread)
        while not _fast_round(strategies, results, lock, registry):
            _restarted(results, lock)
        if (round_number + 1) % 20 == 0:
            print(f"  watch latency: {round_number + 1}/{rounds} rounds", flush=True)
    for thread in slow_threads:
        thread.join()
    for round_number in range(rounds):
        for name in random.sample(CLEAN_VARIANTS, k=len(CLEAN_VARIANTS)):
            while not _fast_round([name], results, lock, registry):
                _restarted(results, lock)
        if (round_number + 1) % 20 == 0:
            print(f"  clean endings: {round_number + 1}/{rounds} rounds", flush=True)
    return results


def _fast_round(
    strategies: Sequence[str],
    results: LatencyResults,
    lock: threading.Lock,
    registry: Path,
) -> bool:
    def starter(name: str) -> Callable[[], scenarios.StartedWorker]:
        strategy, backend = _variant(name)
        clean = name.endswith(CLEAN)
        kinds: list[RunnerKind] = ["idle", "gil"]
        if clean and ring_scenario.mlx_available():
            kinds.append("mlxloop")
        grace = str(settings.DEFAULT_GRACE_SECONDS) if clean else "0"
        return functools.partial(
            scenarios.start_worker,
            kinds,
            strategy=strategy,
            registry=registry,
            # Busy wait 0: the `gil` runner never returns from native code (wedged by
            # construction), killed at the old 0.5 s bound; busy runners: busy_latency.
            extra_env={
                settings.BACKEND_ENV: backend,
                settings.GRACE_ENV: grace,
                settings.BUSY_WAIT_ENV: "0",
            },
            notes=registry / "notes" if clean else None,
        )

    (registry / "notes").mkdir(parents=True, exist_ok=True)

    workers = _start_all([starter(name) for name in strategies])
    if workers is None:
        return False
    order = list(zip(strategies, workers, strict=True))
    random.shuffle(order)
    try:
        time.sleep(scenarios.GIL_SETTLE_SECONDS)
        for strategy, worker in order:
            _measure(strategy, worker, results, lock)
    finally:
        for worker in workers:
            scenarios.cleanup(worker)
    return True


def _start_all(
    starters: Sequence[Callable[[], scenarios.StartedWorker]],
) -> list[scenarios.StartedWorker] | None:
    """Every worker of a round, side by side; None, with none left running, if one did
    not start (a shared machine under load): the round is then run again, and counted."""
    with ThreadPoolExecutor(max_workers=len(starters)) as pool:
        futures = [pool.submit(start) for start in starters]
    started: list[scenarios.StartedWorker] = []
    failures: list[RuntimeError] = []
    for future in futures:
        try:
            started.append(future.result())
        except RuntimeError as error:
            failures.append(error)
    if not failures:
        return started
    for worker in started:
        scenarios.cleanup(worker)
    print(f"  watch latency: round restarted: {failures[0]}", flush=True)
    return None


def _restarted(results: LatencyResults, lock: threading.Lock) -> None:
    with lock:
        results.restarts += 1
        if results.restarts > MAX_RESTARTS:
            raise RuntimeError(f"more than {MAX_RESTARTS} rounds had a worker fail to start")


def _variant(name: str) -> tuple[settings.Strategy, str]:
    """Strategy and EXO_ORPHAN_GUARD_BACKEND value of a row."""
    name = name.removesuffix(CLEAN)
    backend = "portable" if name.endswith(PORTABLE_SUFFIX) else "auto"
    for strategy in settings.STRATEGIES:
        if strategy == name.removesuffix(PORTABLE_SUFFIX):
            return strategy, backend
    raise ValueError(f"no strategy in row name {name!r}")


def _measure(
    name: str,
    worker: scenarios.StartedWorker,
    results: LatencyResults,
    lock: threading.Lock,
) -> None:
    clean = name.endswith(CLEAN)
    extra: frozenset[RunnerKind] = frozenset({"mlxloop"} if clean else ())
    covered = selftest.MECHANISM_COVERS[_variant(name)[0]] | extra
    expected = [runner for runner in worker.runners if runner.kind in covered]
    itself = identity_of(worker.pid)
    killed_at = scenarios.kill_worker(worker, settle=False)
    watched = [runner.identity for runner in expected] + ([itself] if itself else [])
    exits = scenarios.wait_gone(watched, FAST_DEADLINE_SECONDS)
    if itself is not None and (seen := exits.pop(itself)) is not None:
        with lock:
            results.cell(FLOOR, "idle", FAST_DEADLINE_SECONDS).samples.add(
                (seen - killed_at) * 1000
            )
    # Runners this mechanism cannot reach are checked once the deadline has passed.
    remaining = FAST_DEADLINE_SECONDS - (time.monotonic() - killed_at)
    uncovered = [runner.identity for runner in worker.runners if runner.kind not in covered]
    if uncovered:
        exits |= scenarios.wait_gone(uncovered, max(0.0, remaining))
    _record(name, worker, exits, killed_at, results, lock, FAST_DEADLINE_SECONDS)
    if clean:
        _record_begun(name, worker, killed_at, results, lock)


def _record_begun(
    name: str,
    worker: scenarios.StartedWorker,
    killed_at: float,
    results: LatencyResults,
    lock: threading.Lock,
) -> None:
    """When WorkerGone was raised on each runner's main thread (its own note, on the
    same monotonic clock): the clean ending began. A wedged runner never begins."""
    notes = worker.notes
    assert notes is not None
    with lock:
        for runner in worker.runners:
            if runner.kind == "gil":
                continue
            raised = next(
                (n for n in read_notes(notes, runner.identity.pid) if n["event"] == "raised"),
                None,
            )
            cell = results.cell(f"{name}{BEGUN}", runner.kind, FAST_DEADLINE_SECONDS)
            cell.samples.add(None if raised is None else (raised["at"] - killed_at) * 1000)


def _slow_round(results: LatencyResults, lock: threading.Lock, registry: Path) -> None:
    idle: list[RunnerKind] = ["idle"]
    gil: list[RunnerKind] = ["gil"]
    kinds = idle * SLOW_RUNNERS_PER_KIND + gil * SLOW_RUNNERS_PER_KIND
    watches: list[Watch] = ["pr2205", "none"]
    while (
        workers := _start_all(
            [
                functools.partial(scenarios.start_worker, kinds, watch=watch, registry=registry)
                for watch in watches
            ]
        )
    ) is None:
        _restarted(results, lock)
    try:
        time.sleep(scenarios.GIL_SETTLE_SECONDS)
        killed = [
            (watch, worker, scenarios.kill_worker(worker, settle=False))
            for watch, worker in zip(watches, workers, strict=True)
        ]
        for watch, worker, killed_at in killed:
            remaining = SLOW_DEADLINE_SECONDS - (time.monotonic() - killed_at)
            exits = scenarios.wait_gone(
                [runner.identity for runner in worker.runners], max(0.0, remaining)
            )
            name = "PR 2205 (getppid every 5 s)" if watch == "pr2205" else "no guard"
            _record(name, worker, exits, killed_at, results, lock, SLOW_DEADLINE_SECONDS)
    finally:
        for worker in workers:
            scenarios.cleanup(worker)


def _record(
    name: str,
    worker: scenarios.StartedWorker,
    exits: dict[ProcessIdentity, float | None],
    killed_at: float,
    results: LatencyResults,
    lock: threading.Lock,
    deadline: float,
) -> None:
    with lock:
        for runner in worker.runners:
            seen = exits.get(runner.identity)
            cell = results.cell(name, runner.kind, deadline)
            cell.samples.add(None if seen is None else (seen - killed_at) * 1000)


def render(results: LatencyResults) -> str:
    lines = [
        "| strategy | ending | runner | trials | exited | p50 ms | p99 ms | max ms |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in sorted(results.cells, key=_row_order):
        for kind, cell in results.cells[name].items():
            label = "-" if name == FLOOR else KIND_LABELS.get(kind, kind)
            samples = cell.samples
            lines.append(
                f"| {name} | {_ending(name)} | {label} | {samples.count} | {samples.exited} | "
                f"{samples.quantile_text(0.50, cell.deadline_s)} | "
                f"{samples.quantile_text(0.99, cell.deadline_s)} | "
                f"{samples.quantile_text(1.0, cell.deadline_s)} |"
            )
    return "\n".join(lines)


def _ending(name: str) -> str:
    if name.endswith(BEGUN):
        return "clean: begun"
    if name.endswith(CLEAN):
        return "clean: gone"
    if name == FLOOR or name.startswith(("PR 2205", "no guard")):
        return "-"
    return "grace 0: killed at once"


def _row_order(name: str) -> tuple[int, str]:
    """Clean endings first, then the floor, the mechanisms, their portable rows, and
    what exo has without the guard."""
    if name.endswith((CLEAN, BEGUN)):
        return 0, name
    if name == FLOOR:
        return 1, name
    if name.startswith(("PR 2205", "no guard")):
        return 4, name
    return (3 if PORTABLE_SUFFIX in name else 2), name


class CellSamples(TypedDict):
    strategy: str
    runner: RunnerKind
    deadline_s: float
    samples_ms: list[float | None]
    """None: still alive at the deadline."""


class SamplesDocument(TypedDict):
    schema: str
    command: str
    machine: str
    date: str
    rounds: int
    cells: list[CellSamples]


def save_samples(
    results: LatencyResults, path: Path, *, command: str, machine: str, date: str
) -> None:
    """Every raw sample of the run, so the picture is drawn from the table's own data."""
    document = SamplesDocument(
        schema=SAMPLES_SCHEMA,
        command=command,
        machine=machine,
        date=date,
        rounds=results.rounds,
        cells=[
            CellSamples(
                strategy=name,
                runner=kind,
                deadline_s=cell.deadline_s,
                samples_ms=[
                    None if value is None else round(value, 3) for value in cell.samples.values
                ],
            )
            for name, kinds in results.cells.items()
            for kind, cell in kinds.items()
        ],
    )
    path.write_text(json.dumps(document, indent=1) + "\n")
