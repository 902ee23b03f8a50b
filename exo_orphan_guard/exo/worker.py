"""Worker-side hooks: what exo's main process calls.

All are no-ops unless EXO_ORPHAN_GUARD is on, and none raises into exo: a failure is
logged as a warning and exo carries on as it would without the guard.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final, final

import anyio
from loguru import logger

from ..sweeper.sweep_report import SweepReport
from ..sweeper.sweeping import sweep_async
from ..system.identity import current_identity
from ..system.once import warn_once
from ..system.settings import WORKER_ENV, guard_enabled
from .explain import Explanation, explain

_started_in_this_process = False
DIAGNOSIS_SWEEP_SECONDS: Final = 5.0
"""How long the sweep after a runner failure may hold up exo's failure path. What it
has not done by then (a runner ending by itself it waits for, the lock) it leaves to
the sweep before the retry's ConnectToGroup, which waits without holding anything up."""


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
    except Exception as error:  # the guard must never break exo's start-up
        logger.opt(exception=error).warning("orphan guard: could not record the worker")


async def worker_sweep(reason: str) -> SweepReport | None:
    """Sweep from exo's event loop (in a thread) and log what happened.

    `reason` names the moment ("worker start", "connect to group ...") in the logs.
    Returns the report, or None when the guard is off or the sweep failed.
    """
    if not _enabled():
        return None

    def waiting(line: str) -> None:
        logger.warning(f"orphan guard: sweep before {reason}: {line}")

    try:
        report = await sweep_async(on_wait=waiting)
    except Exception as error:  # never let a sweep take the worker down
        logger.opt(exception=error).warning(f"orphan guard: sweep before {reason} failed")
        return None
    log_report(report, reason)
    return report


async def sweep_at_worker_start() -> SweepReport | None:
    """The start-up sweep, once per process: exo re-creates its Worker at every master
    election, and each new Worker calls this again."""
    global _started_in_this_process
    if _started_in_this_process:
        return None
    _started_in_this_process = True
    return await worker_sweep("worker start")


@final
@dataclass(frozen=True, slots=True)
class FailureDiagnosis:
    error_message: str
    explanations: tuple[Explanation, ...]
    sweep: SweepReport | None


async def diagnose_runner_failure(error_message: str) -> FailureDiagnosis | None:
    """Explain a runner's failure (exo's `RunnerFailed.error_message`) and sweep at once.

    If `explain` recognises the text, the diagnosis and the result of an immediate
    sweep are logged side by side, so the retry exo is about to make starts on a node
    without leftover runners. Returns None for text it does not recognise.

    The sweep is shielded from cancellation, for exo calls this from a task whose
    scope it has just cancelled (`RunnerSupervisor._check_runner` from its runner
    watch), and bounded by `DIAGNOSIS_SWEEP_SECONDS` instead (then `sweep` is None).
    """
    if not _enabled():
        return None
    explanations = tuple(explain(error_message))
    if not explanations:
        return None
    for explanation in explanations:
        steps = "; ".join(explanation.next_steps)
        logger.warning(
            f"orphan guard: runner failed: {explanation.title}. {explanation.cause} "
            f"Next: {steps}. Sources: {' '.join(explanation.sources)}"
        )
    reason = f"the retry after a runner failure ({explanations[0].key})"
    report: SweepReport | None = None
    with anyio.CancelScope(shield=True), anyio.move_on_after(DIAGNOSIS_SWEEP_SECONDS) as bound:
        report = await worker_sweep(reason)
    if bound.cancelled_caught:
        logger.warning(
            f"orphan guard: sweep before {reason}: not done in {DIAGNOSIS_SWEEP_SECONDS:g} s, "
            "left to the sweep before the retry's ConnectToGroup"
        )
    return FailureDiagnosis(error_message, explanations, report)


def log_report(report: SweepReport, reason: str) -> None:
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
            logger.warning(
                f"orphan guard: killed orphan {result.target.pid}{labels} "
                f"({verdict.reason}; rule {verdict.rule})"
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
