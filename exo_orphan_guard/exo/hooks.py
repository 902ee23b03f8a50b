"""What exo's worker hook reaches (`src/exo/worker/orphan_guard.py` in exo's tree).

exo's runners guard themselves: the in-tree module hands a runner its own Shutdown
when its worker dies, with the standard library and exo's own code, and never calls
this package. What the package adds runs outside the runners: `guard_exo_worker`,
called by the in-tree `guard_worker` on a thread before the worker's plan loop
begins (exo awaits it, its event loop serving meanwhile), sweeps once for leftover
runners of a dead exo, so that no new runner meets an orphan still holding the
node's memory or ports, then makes sure a guardian runs (`guardian_start`: one
started, detached, if none of this user's does). It changes nothing in the worker's
environment or its runners; the guardian (`service run`) and the CLI's sweeps run
outside exo altogether.

It never raises into exo: a failure is one warning and exo goes on unguarded.
"""

from __future__ import annotations

import threading

from loguru import logger

from ..sweeper.sweeping import DEFAULT_KILL_WAIT_SECONDS, DEFAULT_LOCK_TIMEOUT_SECONDS, sweep
from ..system.once import warn_once
from ..system.settings import busy_wait_setting, grace_setting, guard_enabled, interrupt_bound
from .guardian_start import ensure_guardian
from .worker import log_report

_started = threading.Lock()
_done = threading.Event()


def guard_exo_worker() -> None:
    """Sweep, then a guardian (started on a thread of its own), once per process;
    returns when the sweep has ended (bounded by the lock's timeout, the busy wait and
    the wait after SIGKILL). A new master's election makes a new Worker: a later
    caller returns when the first caller's sweep ends, and never waits longer than
    that sweep's bound."""
    if not _enabled():
        return
    if not _started.acquire(blocking=False):
        bound = _sweep_bound()
        if not _done.wait(bound):
            logger.warning(
                f"orphan guard: the first worker's sweep still runs after {bound:g} s: "
                "this worker does not wait for it any longer"
            )
        return
    try:
        _sweep("the worker's plan loop")
        # Not awaited: the plan loop waits for the sweep, not for a process to start.
        threading.Thread(
            target=_ensure_guardian, name="exo-orphan-guard-guardian", daemon=True
        ).start()
    except Exception as error:  # the guard must never break exo's start-up
        logger.opt(exception=error).warning("orphan guard: could not guard this worker")
    finally:
        _done.set()


def _ensure_guardian() -> None:
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


def _sweep_bound() -> float:
    """The longest a sweep runs: its lock's timeout, then a runner's wait after SIGINT
    (the busy wait, never less than the grace), then the wait after SIGKILL."""
    interrupt_wait = interrupt_bound(busy_wait_setting().value, grace_setting().value)
    return DEFAULT_LOCK_TIMEOUT_SECONDS + interrupt_wait + DEFAULT_KILL_WAIT_SECONDS


def _enabled() -> bool:
    toggle = guard_enabled()
    if toggle.warning is not None:
        warn_once(toggle.warning)
    return toggle.value
