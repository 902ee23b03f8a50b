"""What a sweep costs as the machine gets busier, next to PR 2205's `ps | awk` line.

For each load (N unrelated processes alive besides the machine's own), the same
registry of live guarded runners is swept three ways, interleaved in random order:
registry only (the worker's hook with the fingerprint scan off), full (registry plus
the fingerprint scan, the default), and the CLI end to end; beside them the shell
pipeline exo PR 2205 proposed for finding orphans.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.sweeper.sweeping import sweep

from .stats import Samples

PS_AWK = "ps -axo pid,ppid,command | awk '$2==1 && /spawn_main/'"
LOADS = (50, 500, 2000)


@dataclass(frozen=True)
class LoadResult:
    unrelated: int
    total_processes: int
    samples: dict[str, Samples]


def run(repetitions: int, registry: Path) -> list[LoadResult]:
    runners: list[RunnerKind] = ["idle", "idle", "idle", "idle"]
    guarded = scenarios.start_worker(runners, registry=registry)
    results: list[LoadResult] = []
    try:
        for load in LOADS:
            with UnrelatedProcesses(load):
                results.append(_measure(load, repetitions, registry))
                print(f"  sweep cost: {load} unrelated processes done", flush=True)
    finally:
        scenarios.cleanup(guarded)
    return results


def _measure(load: int, repetitions: int, registry: Path) -> LoadResult:
    methods: dict[str, Callable[[], object]] = {
        "registry sweep (in process)": lambda: sweep(registry_dir=registry, fingerprint=False),
        "full sweep (in process)": lambda: sweep(registry_dir=registry),
        "`exo-orphan-guard scan` (CLI, end to end)": lambda: subprocess.run(
            [sys.executable, "-m", "exo_orphan_guard", "scan", "--dir", str(registry)],
            capture_output=True,
            check=False,
        ),
        f"`{PS_AWK}`": lambda: subprocess.run(PS_AWK, shell=True, capture_output=True, check=False),
    }
    samples = {name: Samples() for name in methods}
    for method in methods.values():
        method()  # warm caches once
    for _ in range(repetitions):
        order = list(methods.items())
        random.shuffle(order)
        for name, method in order:
            started = time.perf_counter()
            method()
            samples[name].add((time.perf_counter() - started) * 1000)
    return LoadResult(load, len(psutil.pids()), samples)


class UnrelatedProcesses:
    def __init__(self, count: int) -> None:
        self._count = count
        self._holder: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> None:
        script = f"for i in $(seq {self._count}); do sleep 3600 & done; wait"
        self._holder = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
        deadline = time.monotonic() + 60
        while len(psutil.Process(self._holder.pid).children()) < self._count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not start {self._count} processes")
            time.sleep(0.05)

    def __exit__(self, *_: object) -> None:
        if self._holder is not None:
            os.killpg(self._holder.pid, signal.SIGKILL)
            self._holder.wait()


def render(results: list[LoadResult], column: str = "method") -> str:
    lines = [
        f"| unrelated processes (total alive) | {column} | median ms | p99 ms |",
        "|---|---|---:|---:|",
    ]
    for result in results:
        for name, samples in result.samples.items():
            lines.append(
                f"| {result.unrelated} ({result.total_processes}) | {name} | "
                f"{samples.quantile_text(0.5, 0)} | {samples.quantile_text(0.99, 0)} |"
            )
    return "\n".join(lines)
