"""What an idle, guarded runner pays for its watch over a minute.

CPU time and context switches (wake-ups) of the runner and its helpers (the watchdog
and its understudy), summed over every thread, and their memory, per strategy, all
runners idle side by side.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.scenario_worker import Watch
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.tools import selftest


@dataclass(frozen=True)
class Usage:
    cpu_s: float
    wakeups: int


@dataclass(frozen=True)
class IdleCost:
    name: str
    cpu_ms: float
    wakeups: int
    runner_rss_mib: float
    helpers: int
    watchdog_rss_mib: float | None
    helpers_uss_mib: float | None
    """The watchdog's and its understudy's own memory, together."""


def run(seconds: float, registry: Path) -> list[IdleCost]:
    cells: list[tuple[str, Watch, settings.Strategy]] = [
        (strategy, "guard", strategy) for strategy in selftest.strategies_here()
    ]
    cells.append(("PR 2205 (getppid every 5 s)", "pr2205", "auto"))
    cells.append(("no guard", "none", "auto"))
    workers = [
        scenarios.start_worker(["idle"], watch=watch, strategy=strategy, registry=registry)
        for _, watch, strategy in cells
    ]
    try:
        time.sleep(1.0)  # the understudies stand by
        trees = [_tree(worker.runners[0].identity) for worker in workers]
        before = [_usage(tree) for tree in trees]
        time.sleep(seconds)
        after = [_usage(tree) for tree in trees]
        costs: list[IdleCost] = []
        for (name, _, _), worker, tree, start, end in zip(
            cells, workers, trees, before, after, strict=True
        ):
            runner = worker.runners[0]
            helpers = tree[1:]
            costs.append(
                IdleCost(
                    name=name,
                    cpu_ms=(end.cpu_s - start.cpu_s) * 1000,
                    wakeups=end.wakeups - start.wakeups,
                    runner_rss_mib=_rss(runner.identity),
                    helpers=len(helpers),
                    watchdog_rss_mib=_rss(runner.watchdog) if helpers else None,
                    helpers_uss_mib=sum(map(_uss, helpers)) if helpers else None,
                )
            )
        return costs
    finally:
        for worker in workers:
            scenarios.cleanup(worker)


def _tree(runner: ProcessIdentity) -> tuple[ProcessIdentity, ...]:
    """The runner and what the guard started for it (an idle runner starts nothing)."""
    found = (identity_of(pid) for pid in system.descendants(runner.pid))
    return (runner, *(identity for identity in found if identity is not None))


def _usage(processes: tuple[ProcessIdentity, ...]) -> Usage:
    cpu = 0.0
    wakeups = 0
    for identity in processes:
        times = psutil.Process(identity.pid).cpu_times()
        cpu += times.user + times.system
        for task in os.listdir(f"/proc/{identity.pid}/task"):
            with open(f"/proc/{identity.pid}/task/{task}/status") as status:
                for line in status:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        wakeups += int(line.split()[1])
    return Usage(cpu, wakeups)


def _rss(identity: ProcessIdentity) -> float:
    return psutil.Process(identity.pid).memory_info().rss / 2**20


def _uss(identity: ProcessIdentity) -> float:
    return psutil.Process(identity.pid).memory_full_info().uss / 2**20


def render(costs: list[IdleCost], seconds: float) -> str:
    lines = [
        f"| strategy | CPU ms in {seconds:.0f} s | wake-ups in {seconds:.0f} s | runner RSS MiB "
        "| helpers | watchdog RSS MiB | helpers' USS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for cost in costs:
        rss = "-" if cost.watchdog_rss_mib is None else f"{cost.watchdog_rss_mib:.1f}"
        uss = "-" if cost.helpers_uss_mib is None else f"{cost.helpers_uss_mib:.1f}"
        lines.append(
            f"| {cost.name} | {cost.cpu_ms:.1f} | {cost.wakeups} | {cost.runner_rss_mib:.1f} "
            f"| {cost.helpers} | {rss} | {uss} |"
        )
    return "\n".join(lines)
