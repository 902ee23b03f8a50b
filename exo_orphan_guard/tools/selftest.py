"""`exo-orphan-guard selftest`: prove the parent watch on this machine.

For every strategy this OS offers, a stand-in worker with four runners (idle, holding
the GIL, with a child of its own, and one not yet guarded when its worker dies) is
SIGKILLed; each runner a strategy covers, and what it started, must be gone, and each
it does not cover still there a second later. A control round with the guard off must
leave orphans, or the test proves nothing here.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from .. import system
from ..records.host_key import host_key
from ..rig import scenarios
from ..rig.scenario_worker import RunnerKind, Watch
from ..system import settings
from ..watch.waiters import can_use_kqueue, can_use_pidfd
from . import rdma_ports, stranded_memory

KINDS: Final[tuple[RunnerKind, ...]] = ("idle", "gil", "child", "late")
DEADLINE_SECONDS: Final = 5.0
"""How long a covered runner may take to go: p50 about 0.1 s, 0.5-0.6 s for one held in
native code at the wedge bound (docs/benchmarks.md); the rest is for a machine busy
with a model, where a PASS must not turn FAIL. Waited in full only for a failure."""
LOOK_SECONDS: Final = 1.0
"""How long after the kill an uncovered runner (and every one, guard off) is watched."""

MECHANISM_COVERS: Final[Mapping[settings.Strategy, frozenset[RunnerKind]]] = {
    "auto": frozenset(KINDS),
    "watchdog": frozenset(KINDS),
    # Kills the runner from the kernel, GIL or not, but nothing the runner started.
    "pdeathsig": frozenset({"idle", "gil", "late"}),
    # Threads inside the runner: they cannot run while its main thread holds the GIL.
    "pidfd": frozenset({"idle", "child", "late"}),
    "kqueue": frozenset({"idle", "child", "late"}),
    "sentinel": frozenset({"idle", "child", "late"}),
    "poll": frozenset({"idle", "child", "late"}),
}
"""What each strategy, armed alone, is designed to cover. `auto` arms all that apply."""


@final
@dataclass(frozen=True, slots=True)
class KindResult:
    kind: RunnerKind
    covered: bool
    latency_ms: float | None
    """Until the runner and everything it started was gone; None if some was not."""

    @property
    def passed(self) -> bool:
        return (self.latency_ms is not None) == self.covered


@final
@dataclass(frozen=True, slots=True)
class StrategyResult:
    strategy: settings.Strategy | None
    """None for the control round with the guard off."""
    kinds: tuple[KindResult, ...]
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(result.passed for result in self.kinds)


def strategies_here() -> tuple[settings.Strategy, ...]:
    available: list[settings.Strategy] = ["auto", "watchdog"]
    if system.BACKEND == "linux":
        available.append("pdeathsig")
    if can_use_pidfd():
        available.append("pidfd")
    if can_use_kqueue():
        available.append("kqueue")
    available.extend(("sentinel", "poll"))
    return tuple(available)


def run_selftest(
    strategies: Sequence[settings.Strategy] | None = None,
    progress: Callable[[StrategyResult], None] | None = None,
) -> list[StrategyResult]:
    results: list[StrategyResult] = []
    with tempfile.TemporaryDirectory(prefix="eog-selftest-") as registry:
        for strategy in (*(strategies or strategies_here()), None):
            result = _run_one(strategy, Path(registry))
            results.append(result)
            if progress is not None:
                progress(result)
    return results


def _run_one(strategy: settings.Strategy | None, registry: Path) -> StrategyResult:
    watch: Watch = "none" if strategy is None else "guard"
    covers = frozenset[RunnerKind]() if strategy is None else MECHANISM_COVERS[strategy]
    try:
        worker = scenarios.start_worker(
            KINDS,
            watch=watch,
            strategy=strategy or "auto",
            registry=registry,
            # Its `gil` runner never returns from native code: a wedge by construction,
            # to be ended within the deadline, not waited for as busy.
            extra_env={settings.BUSY_WAIT_ENV: "0"},
        )
    except (OSError, RuntimeError) as error:
        return StrategyResult(strategy, (), error=f"could not start the worker: {error}")
    try:
        killed_at = scenarios.kill_worker(worker)
        covered = [
            member for runner in worker.runners if runner.kind in covers for member in runner.tree
        ]
        exits = scenarios.wait_gone(covered, DEADLINE_SECONDS)
        others = [member for member in worker.all_processes() if member not in exits]
        exits |= scenarios.wait_gone(others, killed_at + LOOK_SECONDS - time.monotonic())
        kinds: list[KindResult] = []
        for runner in worker.runners:
            seen = [exits[member] for member in runner.tree]
            latency = (
                None
                if any(moment is None for moment in seen)
                else (max(moment for moment in seen if moment is not None) - killed_at) * 1000
            )
            kinds.append(KindResult(runner.kind, runner.kind in covers, latency))
        return StrategyResult(strategy, tuple(kinds))
    finally:
        scenarios.cleanup(worker)


def render_header() -> str:
    """What the rows are: printed before the first row, which comes as its strategy ends."""
    header = f"exo-orphan-guard selftest: {platform.system()} {platform.release()}, "
    header += f"Python {platform.python_version()}, {system.BACKEND} backend; "
    header += f"covered runners gone within {DEADLINE_SECONDS:g} s, "
    header += f"others alive {LOOK_SECONDS:g} s after"
    columns = f"{'strategy':<10} " + " ".join(f"{kind:<14}" for kind in KINDS) + "result"
    return f"{header}\n\n{columns}"


def render_verdict(results: Sequence[StrategyResult]) -> str:
    failed = [result for result in results if not result.passed]
    if not failed:
        return "PASS: every strategy did what it is designed to do."
    return f"FAIL: {len(failed)} of {len(results)} rows failed."


def render_row(result: StrategyResult) -> str:
    name = result.strategy or "guard off"
    if result.error is not None:
        return f"{name:<10} FAIL: {result.error}"
    cells: list[str] = []
    for kind in result.kinds:
        if kind.latency_ms is not None:
            text = f"{kind.latency_ms:.1f} ms"
        else:
            text = "alive" + ("" if kind.covered else " (ok)")
        cells.append(f"{text:<14}")
    return f"{name:<10} " + " ".join(cells) + ("PASS" if result.passed else "FAIL")


def to_json(results: Sequence[StrategyResult]) -> str:
    """One object for a bug report: this machine, the backend, every row's verdict."""
    document = {
        "schema": "exo-orphan-guard/selftest/1",
        "passed": all(result.passed for result in results),
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "version": platform.version(),
            "machine": platform.machine(),
        },
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in ("exo-orphan-guard", "psutil")},
        "backend": system.BACKEND,
        **backend_answers(),
        "deadline_s": DEADLINE_SECONDS,
        "look_s": LOOK_SECONDS,
        "strategies": [
            {
                "strategy": result.strategy or "guard off",
                "passed": result.passed,
                "error": result.error,
                "runners": [
                    {
                        "kind": kind.kind,
                        "covered": kind.covered,
                        "latency_ms": None
                        if kind.latency_ms is None
                        else round(kind.latency_ms, 2),
                        "passed": kind.passed,
                    }
                    for kind in result.kinds
                ],
            }
            for result in results
        ],
    }
    return json.dumps(document, indent=2)


def backend_answers() -> dict[str, object]:
    """What this machine answers to the calls only a Mac runs for real: the registry's
    host key, wired memory beside live footprints (macOS), the RDMA ports' states."""
    key = host_key()
    wired = stranded_memory.measure()
    return {
        "host_key": {"kind": key.kind, "directory": key.name, "previous": key.legacy},
        "wired_memory": None if wired is None else stranded_memory.to_json(wired),
        "rdma": rdma_ports.to_json(rdma_ports.read_devinfo()),
    }


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
