"""What an idle, guarded runner pays for its watch over a minute.

CPU time and context switches (wake-ups) of the runner and its watchdog, summed over
every thread, and their memory, per strategy, all runners idle side by side.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.scenario_worker import Watch
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity
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
    watchdog_rss_mib: float | None
    watchdog_uss_mib: float | None


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
        time.sleep(1.0)
        before = [_usage(worker.runners[0].tree) for worker in workers]
        time.sleep(seconds)
        after = [_usage(worker.runners[0].tree) for worker in workers]
        costs: list[IdleCost] = []
        for (name, _, _), worker, start, end in zip(cells, workers, before, after, strict=True):
            runner = worker.runners[0]
            watchdog = runner.helpers[0] if runner.helpers else None
            costs.append(
                IdleCost(
                    name=name,
                    cpu_ms=(end.cpu_s - start.cpu_s) * 1000,
                    wakeups=end.wakeups - start.wakeups,
                    runner_rss_mib=_rss(runner.identity),
                    watchdog_rss_mib=None if watchdog is None else _rss(watchdog),
                    watchdog_uss_mib=None if watchdog is None else _uss(watchdog),
                )
            )
        return costs
    finally:
        for worker in workers:
            scenarios.cleanup(worker)


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
        "| watchdog RSS MiB | watchdog USS MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for cost in costs:
        rss = "-" if cost.watchdog_rss_mib is None else f"{cost.watchdog_rss_mib:.1f}"
        uss = "-" if cost.watchdog_uss_mib is None else f"{cost.watchdog_uss_mib:.1f}"
        lines.append(
            f"| {cost.name} | {cost.cpu_ms:.1f} | {cost.wakeups} | {cost.runner_rss_mib:.1f} "
            f"| {rss} | {uss} |"
        )
    return "\n".join(lines)
