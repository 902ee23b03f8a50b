"""What exo's two hook calls reach (`src/exo/worker/orphan_guard.py` in exo's tree).

`guard_exo_runner`, first in `bootstrap.entrypoint`: the runner's parent watch, with
exo's own Shutdown as the first step of its ending (`shutdown_task`), then a sweep
for leftover runners of dead workers before its loop takes any task (its group's
ConnectToGroup among them): only this runner waits for it, never the worker's loop.
`guard_exo_worker`, first in `Worker.run`: the worker's identity for its runners, and
one sweep at its start, on a thread of its own.

Neither raises into exo: a failure is one warning and exo goes on unguarded.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping

from loguru import logger

from ..sweeper.sweeping import sweep
from ..system.once import warn_once
from ..system.settings import guard_enabled
from ..watch.handover import Handover
from ..watch.runner_watch import guard_runner_handing_over
from .shutdown_task import ExoShutdown, NotExoError
from .worker import log_report, prepare_worker


def guard_exo_runner(bound_instance: object, task_receiver: object) -> None:
    """The runner ends with its worker, first through the Shutdown exo's loop takes."""
    if not _enabled():
        return
    try:
        labels = _labels(bound_instance)
        guard_runner_handing_over(_handover(bound_instance, task_receiver), labels)
        _sweep(f"runner {labels.get('runner_id', '?')} takes its first task")
    except Exception as error:  # the guard must never break a runner
        logger.opt(exception=error).warning("orphan guard: could not guard this runner")


def guard_exo_worker() -> None:
    """Record the worker for its runners; sweep once per process, beside exo's start."""
    if not _enabled():
        return
    prepare_worker()
    _sweep_at_start_once()


@functools.cache
def _sweep_at_start_once() -> None:
    # exo makes a new Worker at every election: one start-up sweep per process.
    threading.Thread(
        target=_sweep, args=("worker start",), name="exo-orphan-guard-sweep", daemon=True
    ).start()


def _sweep(reason: str) -> None:
    def waiting(line: str) -> None:
        logger.warning(f"orphan guard: sweep before {reason}: {line}")

    try:
        report = sweep(on_wait=waiting)
    except Exception as error:  # a failed sweep must not take exo down
        logger.opt(exception=error).warning(f"orphan guard: sweep before {reason} failed")
        return
    log_report(report, reason)


def _labels(bound_instance: object) -> Mapping[str, str]:
    labels: dict[str, str] = {}
    runner_id: object = getattr(bound_instance, "bound_runner_id", None)
    instance: object = getattr(bound_instance, "instance", None)
    instance_id: object = getattr(instance, "instance_id", None)
    if runner_id is not None:
        labels["runner_id"] = str(runner_id)
    if instance_id is not None:
        labels["instance_id"] = str(instance_id)
    return labels


def _handover(bound_instance: object, task_receiver: object) -> Handover | None:
    try:
        return ExoShutdown(bound_instance, task_receiver)
    except NotExoError as error:
        warn_once(
            f"orphan guard: cannot hand this runner exo's Shutdown ({error}): "
            "when its worker dies it gets WorkerGone at once"
        )
        return None


def _enabled() -> bool:
    toggle = guard_enabled()
    if toggle.warning is not None:
        warn_once(toggle.warning)
    return toggle.value
