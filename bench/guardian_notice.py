"""How long the guardian takes to see a new exo: with 2,000 unrelated `sleep`s alive,
from starting a stand-in worker to the guardian's `watching exo <pid>` line; and what
one scan costs at that size."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import psutil

from exo_orphan_guard.guardian import watchlist
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.judging import judge
from exo_orphan_guard.sweeper.verdicts import SweepOptions
from exo_orphan_guard.system import settings

from .guardian_process import (
    READY,
    WATCH_TIMEOUT_S,
    GuardianProcess,
    guardian_environment,
    idle_runners,
    usage,
    watching,
)
from .stats import Samples
from .sweep_cost import UnrelatedProcesses

NOTICE_LOAD: Final = 2000
NOTICE_RUNNERS: Final = 2
SCAN_REPETITIONS: Final = 20
SCAN_CPU_WINDOW_S: Final = 20.0


@dataclass
class NoticeResults:
    from_start: Samples = field(default_factory=Samples)
    from_up: Samples = field(default_factory=Samples)
    scan: Samples = field(default_factory=Samples)
    guardian_cpu_per_scan_ms: float = 0.0
    total_processes: int = 0


def run_notice(rounds: int, scratch: Path, exo_python: str) -> NoticeResults:
    results = NoticeResults()
    registry = scratch / "notice"
    env = guardian_environment(scratch, registry, "linux")
    with UnrelatedProcesses(NOTICE_LOAD):
        results.total_processes = len(psutil.pids())
        guardian = GuardianProcess(env)
        try:
            guardian.wait_for(READY, WATCH_TIMEOUT_S)
            time.sleep(2 * settings.DEFAULT_SCAN_INTERVAL_SECONDS)  # the start-up sweep
            before = usage(guardian.pid)
            time.sleep(SCAN_CPU_WINDOW_S)
            after = usage(guardian.pid)
            scans = SCAN_CPU_WINDOW_S / settings.DEFAULT_SCAN_INTERVAL_SECONDS
            results.guardian_cpu_per_scan_ms = (after.cpu_s - before.cpu_s) * 1000 / scans
            for _ in range(SCAN_REPETITIONS):
                started = time.perf_counter()
                _one_scan(registry)
                results.scan.add((time.perf_counter() - started) * 1000)
            for number in range(rounds):
                time.sleep(random.uniform(0.0, settings.DEFAULT_SCAN_INTERVAL_SECONDS))
                started_at = time.monotonic()
                worker = scenarios.start_worker(
                    idle_runners(NOTICE_RUNNERS), watch="none", python=exo_python, registry=registry
                )
                try:
                    seen_at, _ = guardian.wait_for(watching(worker.pid), WATCH_TIMEOUT_S)
                    first_runner = min(
                        started_monotonic(runner.identity.pid) for runner in worker.runners
                    )
                finally:
                    scenarios.cleanup(worker)
                results.from_start.add((seen_at - started_at) * 1000)
                results.from_up.add((seen_at - first_runner) * 1000)
                if (number + 1) % 5 == 0:
                    print(f"  guardian notice: {number + 1} of {rounds} rounds", flush=True)
        finally:
            guardian.stop()
    return results


def started_monotonic(pid: int) -> float:
    """When `pid` started, on this process's monotonic clock: its start time in
    /proc/<pid>/stat counts clock ticks (10 ms) of CLOCK_BOOTTIME."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    return started - time.clock_gettime(time.CLOCK_BOOTTIME) + time.monotonic()


def _one_scan(registry: Path) -> None:
    """What the guardian's scan did before its cheap pass (the guardian-scan section
    sets the two side by side): judge the process table as a sweep does, and pick the
    exo processes to watch from it."""
    opened, _ = Registry.open(registry, create=False)
    table, verdicts = judge(opened, SweepOptions(fingerprint=True), [])
    watchlist.exo_processes(table, verdicts)


def render_notice(results: NoticeResults, rounds: int) -> str:
    rows = [
        ("start of the stand-in worker → `watching exo <pid>`", rounds, results.from_start),
        ("its first runner's start → `watching exo <pid>`", rounds, results.from_up),
        (
            "one full scan (`judge` over every command line + the watch list), in process",
            SCAN_REPETITIONS,
            results.scan,
        ),
    ]
    lines = [
        f"| at {NOTICE_LOAD} unrelated processes ({results.total_processes} alive) "
        "| trials | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, count, samples in rows:
        lines.append(
            f"| {name} | {count} | {samples.quantile_text(0.5, WATCH_TIMEOUT_S)} | "
            f"{samples.quantile_text(0.99, WATCH_TIMEOUT_S)} | "
            f"{samples.quantile_text(1.0, WATCH_TIMEOUT_S)} |"
        )
    lines.append(
        f"| the guardian's own CPU per scan (over {SCAN_CPU_WINDOW_S:g} s, no exo) | "
        f"{SCAN_CPU_WINDOW_S / settings.DEFAULT_SCAN_INTERVAL_SECONDS:.0f} | "
        f"{results.guardian_cpu_per_scan_ms:.1f} (mean) | - | - |"
    )
    return "\n".join(lines)
