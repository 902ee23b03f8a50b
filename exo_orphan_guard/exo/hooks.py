"""What the local series' worker hook reaches (`src/exo/worker/orphan_guard.py` in
exo's tree, `exo_tree_with_package/`).

exo's runners guard themselves: exo's own parent watch (the PR) hands a runner its
Shutdown when its worker dies, and exo's own start-up sweep ends the leftovers exo
recorded; neither calls this package. What the package adds runs outside the
runners: `guard_exo_worker`, called by the local `guard_worker` on a daemon thread
before the worker's plan loop begins (exo awaits it, its event loop serving
meanwhile), writes the hand-over marker (this worker's runners hand themselves their
Shutdown: the guardian gives them the grace), sweeps once for leftover runners no
record names (an exo without the guard, EXO.app's), so that no new runner meets an
orphan still holding the node's memory or ports, then makes sure a guardian runs
(`guardian_start`: one started, detached, if none of this user's does). It changes
nothing in the worker's environment or its runners; the guardian (`service run`)
and the CLI's sweeps run outside exo altogether.

It never raises into exo: a failure is one warning and exo goes on unguarded.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

from loguru import logger

from ..records import handover_marker
from ..sweeper.sweeping import DEFAULT_KILL_WAIT_SECONDS, DEFAULT_LOCK_TIMEOUT_SECONDS, sweep
from ..system.once import warn_once
from ..system.settings import (
    busy_wait_setting,
    grace_setting,
    guard_enabled,
    interrupt_bound,
    registry_dir,
)
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
        write_handover_marker(registry_dir())
    except OSError as error:
        logger.warning(f"orphan guard: could not write the hand-over marker ({error!r})")
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


def write_handover_marker(base: Path) -> None:
    """`<base>/handover/<pid>.json`: this worker's runners hand themselves Shutdown
    (`records.handover_marker`), written whole."""
    marker = handover_marker.marker_path(base, os.getpid())
    base.parent.mkdir(parents=True, exist_ok=True)
    for directory in (base, marker.parent):
        directory.mkdir(mode=0o700, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=marker.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            json.dump({"pid": os.getpid(), "at": time.time()}, file)
        os.replace(temporary, marker)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
