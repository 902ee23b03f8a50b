"""From a worker's SIGKILL until the next MLX group on the same ports has formed.

The worker's rank 0 is inside `mx.distributed.init()` (ring backend, loopback) when
its worker is killed; a new worker then starts ranks 1 and 0, half a second apart.
Guard on and off alternate. Without the guard the next group never forms: those
trials are bounded by a timeout and reported as such.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from exo_orphan_guard.rig import ring_scenario

from .stats import Samples

HANG_TIMEOUT_SECONDS = 10.0


@dataclass
class ReformResults:
    trials_on: int
    trials_off: int
    on: Samples = field(default_factory=Samples)
    off: Samples = field(default_factory=Samples)
    orphan_gone_on: Samples = field(default_factory=Samples)


def run(trials: int) -> ReformResults:
    off_trials = max(1, trials // 4)
    results = ReformResults(trials, off_trials)
    # Interleaved: one guard-off trial after every four guard-on trials.
    plan: list[bool] = []
    for number in range(trials):
        plan.append(True)
        if number % 4 == 3 or number == trials - 1:
            plan.extend([False] * min(1, off_trials - plan.count(False)))
    for number, guard in enumerate(plan, start=1):
        with tempfile.TemporaryDirectory(prefix="eog-bench-ring-") as scratch:
            outcome = ring_scenario.orphan_then_next_group(
                guard=guard, timeout=HANG_TIMEOUT_SECONDS, scratch=Path(scratch)
            )
        seconds = outcome.form_seconds * 1000 if outcome.formed else None
        (results.on if guard else results.off).add(seconds)
        if guard:
            results.orphan_gone_on.add(outcome.orphan_gone_ms)
        if number % 5 == 0:
            print(f"  group re-form: {number}/{len(plan)} trials", flush=True)
    return results


def render(results: ReformResults) -> str:
    deadline = HANG_TIMEOUT_SECONDS
    lines = [
        "| guard | trials | next group formed | p50 s | p99 s | max s | orphan gone p50 / max ms |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, samples, trials in (
        ("on", results.on, results.trials_on),
        ("off", results.off, results.trials_off),
    ):
        cells = [_seconds(samples.quantile(q), deadline) for q in (0.5, 0.99, 1.0)]
        gone = "-"
        if label == "on":
            gone = (
                f"{results.orphan_gone_on.quantile_text(0.5, 1.0)} / "
                f"{results.orphan_gone_on.quantile_text(1.0, 1.0)}"
            )
        else:
            gone = "never (alive at the end)"
        lines.append(f"| {label} | {trials} | {samples.exited} | {' | '.join(cells)} | {gone} |")
    return "\n".join(lines)


def _seconds(milliseconds: float | None, deadline: float) -> str:
    return f"> {deadline:g} (hung)" if milliseconds is None else f"{milliseconds / 1000:.2f}"
