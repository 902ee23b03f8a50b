"""What one guardian scan costs in CPU at `LOAD` unrelated processes, measured in this
process: today's scan (every command line) against the cheap one, fresh, settled and
under churn. A part of `guardian_scan`'s section."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import psutil

from exo_orphan_guard.guardian import watchlist
from exo_orphan_guard.guardian.cheap_scan import CheapScan
from exo_orphan_guard.guardian.known_processes import FULL_LISTING_SCANS
from exo_orphan_guard.sweeper.judging import judge
from exo_orphan_guard.sweeper.verdicts import SweepOptions
from exo_orphan_guard.system import settings

from .stats import Samples
from .sweep_cost import UnrelatedProcesses

LOAD: Final = 2000
OPTIONS: Final = SweepOptions(fingerprint=True)


@dataclass(frozen=True)
class ScanRow:
    name: str
    samples: Samples


def run_scans(repetitions: int) -> tuple[list[ScanRow], int]:
    """CPU time (`time.process_time`) of one scan and the watch list, at `LOAD`; and
    the processes alive meanwhile."""
    with UnrelatedProcesses(LOAD):
        alive = len(psutil.pids())
        today = Samples()
        for _ in range(repetitions // 5):
            today.add(_timed(lambda: _judge(None)))
        first, steady, churn = Samples(), Samples(), Samples()
        for _ in range(5):
            first.add(_timed(lambda: _judge(CheapScan())))
        cheap = CheapScan()
        _judge(cheap)
        _judge(cheap)  # settled
        for _ in range(repetitions):
            steady.add(_timed(lambda: _judge(cheap)))
        for _ in range(repetitions):
            subprocess.run(["true"], check=True)
            churn.add(_timed(lambda: _judge(cheap)))
    rows = [
        ScanRow("today's: every command line", today),
        ScanRow(
            f"cheap, nothing started (p50); a whole listing every {FULL_LISTING_SCANS} scans (p99)",
            steady,
        ),
        ScanRow("cheap, a process started before each scan", churn),
        ScanRow("cheap, its first scan (everything read)", first),
    ]
    return rows, alive


def _judge(scan: CheapScan | None) -> None:
    """Judged as the guardian judges: `scan`'s candidates and memo; None: today's."""
    if scan is None:
        table, verdicts = judge(None, OPTIONS, [])
    else:
        table, verdicts = judge(None, OPTIONS, [], scan.candidates(), scan.memo)
    watchlist.exo_processes(table, verdicts)


def _timed(call: Callable[[], object]) -> float:
    started = time.process_time()
    call()
    return (time.process_time() - started) * 1000


def render_scans(rows: list[ScanRow], total: int) -> str:
    interval = settings.DEFAULT_SCAN_INTERVAL_SECONDS
    lines = [
        f"| one scan at {LOAD} unrelated processes ({total} alive) | scans | p50 ms | p99 ms "
        f"| max ms | mean ms | a minute of scans (mean x {60 / interval:.0f}) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        values = [value for value in row.samples.values if value is not None]
        mean = sum(values) / len(values)
        lines.append(
            f"| {row.name} | {row.samples.count} | {row.samples.quantile_text(0.5, 0)} "
            f"| {row.samples.quantile_text(0.99, 0)} | {row.samples.quantile_text(1.0, 0)} "
            f"| {mean:.2f} | {mean * 60 / interval:.0f} |"
        )
    return "\n".join(lines)
