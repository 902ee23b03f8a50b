"""What exo's worker hook reaches (`src/exo/worker/orphan_guard.py` in exo's tree).

exo's runners guard themselves: the in-tree module hands a runner its own Shutdown
when its worker dies, with the standard library and exo's own code, and never calls
this package. What the package adds runs outside the runners: `guard_exo_worker`,
called by the in-tree `guard_worker` (after `Worker.run`'s first log line), starts
one sweep for leftover runners of a dead exo, on a thread of its own, then makes sure
a guardian runs (`guardian_start`: one started, detached, if none of this user's
does), and changes nothing in the worker's environment or its runners; the guardian
(`service run`) and the CLI's sweeps run outside exo altogether.

It never raises into exo: a failure is one warning and exo goes on unguarded.
"""

from __future__ import annotations

import functools
import threading

from loguru import logger

from ..sweeper.sweeping import sweep
from ..system.once import warn_once
from ..system.settings import guard_enabled
from .guardian_start import ensure_guardian
from .worker import log_report


def guard_exo_worker() -> None:
    """Sweep once per process, beside exo's start; then a guardian."""
    if not _enabled():
        return
    try:
        _sweep_at_start_once()
    except Exception as error:  # the guard must never break exo's start-up
        logger.opt(exception=error).warning("orphan guard: could not guard this worker")


@functools.cache
def _sweep_at_start_once() -> None:
    # exo makes a new Worker at every election: one start-up sweep per process.
    threading.Thread(target=_sweep_then_guard, name="exo-orphan-guard-sweep", daemon=True).start()


def _sweep_then_guard() -> None:
    # The sweep first: a guardian started beside it would sweep the same orphans.
    _sweep("worker start")
    try:
        said = ensure_guardian()
    except Exception as error:  # no guardian is no reason to stop exo
        logger.opt(exception=error).warning("orphan guard: could not start a guardian")
        return
    logger.info(f"orphan guard: {said}")


def _sweep(reason: str) -> None:
    def waiting(line: str) -> None:
        logger.warning(f"orphan guard: sweep before {reason}: {line}")

    try:
        report = sweep(on_wait=waiting)
    except Exception as error:  # a failed sweep must not take exo down
        logger.opt(exception=error).warning(f"orphan guard: sweep before {reason} failed")
        return
    log_report(report, reason)


def _enabled() -> bool:
    toggle = guard_enabled()
    if toggle.warning is not None:
        warn_once(toggle.warning)
    return toggle.value
