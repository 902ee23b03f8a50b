"""The worker's side: `prepare_worker` for a program whose runners `guard_runner`
guards, and the log lines of a worker's sweep (`log_report`, exo's worker hook).

`prepare_worker` is a no-op unless EXO_ORPHAN_GUARD is on, and never raises: a
failure is logged as a warning and the program carries on as it would without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..system.identity import current_identity
from ..system.once import warn_once
from ..system.settings import WORKER_ENV, guard_enabled

if TYPE_CHECKING:
    from ..sweeper.sweep_report import SweepReport


def prepare_worker() -> None:
    """Record this process as the worker its runners must die with.

    Call once in the worker before it spawns runners (more calls are harmless). The
    identity (pid and start stamp) goes into the environment, which every runner
    inherits at spawn, so a runner that starts after its worker died still knows
    whom it belonged to.
    """
    if not _enabled():
        return
    try:
        os.environ[WORKER_ENV] = current_identity().encode()
    except Exception as error:  # the guard must never break the start-up
        from loguru import logger

        logger.opt(exception=error).warning("orphan guard: could not record the worker")


def log_report(report: SweepReport, reason: str) -> None:
    """What a sweep did, in exo's log: each kill, each unkillable process, a summary."""
    # Imported here, as in `prepare_worker`: a program that only prepares its worker
    # (exo has loguru loaded anyway) starts without asyncio, which loguru brings.
    from loguru import logger

    for warning in report.warnings:
        warn_once(f"orphan guard: {warning}")
    for result in report.results:
        verdict = next(v for v in report.targets if v.pid == result.target.pid)
        labels = "".join(f" {key}={value}" for key, value in sorted(verdict.labels.items()))
        if result.outcome == "unkillable":
            logger.error(
                f"orphan guard: process {result.target.pid}{labels} is unkillable "
                f"(state {result.stuck_state or '?'}): {result.advice}"
            )
        else:
            sent = ", ".join(result.signals) or "no signal"
            logger.warning(
                f"orphan guard: ended orphan {result.target.pid}{labels} {result.ended} "
                f"({sent}; {verdict.reason}; rule {verdict.rule})"
            )
    elapsed_ms = report.elapsed_seconds * 1000
    message = f"orphan guard: sweep before {reason}: {report.summary()} in {elapsed_ms:.0f} ms"
    if report.targets or not report.lock_acquired:
        logger.warning(message)
    else:
        logger.info(message)


def _enabled() -> bool:
    toggle = guard_enabled()
    if toggle.warning is not None:
        warn_once(toggle.warning)
    return toggle.value
