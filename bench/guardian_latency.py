"""The guardian's latency: one guardian at a time (its own registry), an exo-shaped
stand-in worker with one idle, unguarded runner per round; the worker is SIGKILLed once
the guardian watches it. SIGINT time is the guardian's own `begun` line (its deadline
less the wait after SIGINT it announced: `time.monotonic()` just before the SIGINT,
the same clock in every process of one boot); gone is the runner's pidfd turning
readable, seen here. Both backends, in alternating blocks of rounds, each block with a
fresh guardian."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from exo_orphan_guard.records import endings
from exo_orphan_guard.records.host_key import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import boot_id
from exo_orphan_guard.system.identity import ProcessIdentity

from .guardian_process import (
    BACKENDS,
    WATCH_TIMEOUT_S,
    Backend,
    GuardianProcess,
    guardian_environment,
    watching,
)
from .stats import Samples

BLOCK_ROUNDS: Final = 10
"""Rounds per guardian: the backends alternate in blocks of this many."""
GONE_TIMEOUT_S: Final = 10.0
PORTABLE_POLL_S: Final = 0.1
MAX_RESTARTS: Final = 10


@dataclass
class LatencyResults:
    to_sigint: dict[Backend, Samples] = field(
        default_factory=lambda: {backend: Samples() for backend in BACKENDS}
    )
    to_gone: dict[Backend, Samples] = field(
        default_factory=lambda: {backend: Samples() for backend in BACKENDS}
    )
    restarts: int = 0


def run_latency(rounds: int, scratch: Path, exo_python: str) -> LatencyResults:
    results = LatencyResults()
    blocks = [min(BLOCK_ROUNDS, rounds - start) for start in range(0, rounds, BLOCK_ROUNDS)]
    for number, block in enumerate(blocks):
        order = list(BACKENDS)
        random.shuffle(order)
        for backend in order:
            registry = scratch / f"latency-{backend}-{number}"
            guardian = GuardianProcess(guardian_environment(scratch, registry, backend))
            try:
                bound = guardian.interrupt_wait()
                done = 0
                while done < block:
                    try:
                        _latency_round(guardian, bound, registry, exo_python, backend, results)
                    except RuntimeError as error:
                        results.restarts += 1
                        print(f"  guardian latency: round again ({error})", flush=True)
                        if results.restarts > MAX_RESTARTS:
                            raise
                        continue
                    done += 1
            finally:
                guardian.stop()
        print(f"  guardian latency: block {number + 1} of {len(blocks)} done", flush=True)
    return results


def _latency_round(
    guardian: GuardianProcess,
    bound: float,
    registry: Path,
    exo_python: str,
    backend: Backend,
    results: LatencyResults,
) -> None:
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python, registry=registry)
    try:
        guardian.wait_for(watching(worker.pid), WATCH_TIMEOUT_S)
        time.sleep(random.uniform(0.05, 0.25))  # off the guardian's scan beat
        runner = worker.runners[0].identity
        killed_at = scenarios.kill_worker(worker)
        gone_at = scenarios.wait_gone([runner], GONE_TIMEOUT_S)[runner]
        begun = _guardian_line(registry, runner, "begun", GONE_TIMEOUT_S)
    finally:
        scenarios.cleanup(worker)
    if begun is None or begun.deadline is None:
        results.to_sigint[backend].add(None)
    else:
        results.to_sigint[backend].add((begun.deadline - bound - killed_at) * 1000)
    results.to_gone[backend].add(None if gone_at is None else (gone_at - killed_at) * 1000)


def _guardian_line(
    registry: Path, runner: ProcessIdentity, event: endings.Event, timeout: float
) -> endings.Ending | None:
    path = host_directory(registry) / endings.ENDINGS_NAME
    deadline = time.monotonic() + timeout
    boot = boot_id()
    while True:
        for ending in endings.read(path, boot):
            if ending.by == "guardian" and ending.identity == runner and ending.event == event:
                return ending
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def render_latency(results: LatencyResults) -> str:
    lines = [
        "| backend | from the worker's SIGKILL to | trials | done | p50 ms | p99 ms | max ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    names: dict[Backend, str] = {
        "linux": "linux (pidfd)",
        "portable": f"portable (polls every {PORTABLE_POLL_S:g} s)",
    }
    for backend in BACKENDS:
        for what, samples in (
            ("SIGINT sent (guardian's `begun`)", results.to_sigint[backend]),
            ("idle runner gone", results.to_gone[backend]),
        ):
            lines.append(
                f"| {names[backend]} | {what} | {samples.count} | {samples.exited} | "
                f"{samples.quantile_text(0.5, GONE_TIMEOUT_S)} | "
                f"{samples.quantile_text(0.99, GONE_TIMEOUT_S)} | "
                f"{samples.quantile_text(1.0, GONE_TIMEOUT_S)} |"
            )
    return "\n".join(lines)
