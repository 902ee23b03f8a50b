"""The parent watch: a runner ends itself and its tree when its worker dies.

`plan_watch` decides which mechanisms to arm (pure, tested with made-up capabilities);
`guard_runner` probes the system, arms them and records the runner.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, NoReturn, final

import psutil
from loguru import logger

from .. import system
from ..sweeper.registry import Registry, RunnerRecord
from ..system import settings
from ..system.identity import ProcessIdentity, current_identity, identity_of, liveness
from ..system.once import warn_once
from .tree_kill import kill_runner_tree
from .waiters import WaiterName, usable_waiters, wait_for_exit
from .watchdog import start_watchdog

ParentDeathSignal = Literal[
    "safe", "spawned-by-other-thread", "not-worker-child", "unknown", "unsupported"
]

_PARENT_DEATH_SIGNAL_REASONS: Final[Mapping[ParentDeathSignal, str]] = {
    "safe": "",
    "spawned-by-other-thread": (
        "the worker spawned this runner from a thread other than its main thread, "
        "and PR_SET_PDEATHSIG would fire when that thread exits"
    ),
    "not-worker-child": "this runner's parent is not the worker",
    "unknown": "the kernel does not say which worker thread spawned this runner",
    "unsupported": "this OS has no PR_SET_PDEATHSIG",
}


@final
@dataclass(frozen=True, slots=True)
class WatchCapabilities:
    waiters: tuple[WaiterName, ...]
    """Usable waiters, preferred first."""
    parent_death_signal: ParentDeathSignal
    can_fork: bool


@final
@dataclass(frozen=True, slots=True)
class WatchPlan:
    thread_chain: tuple[WaiterName, ...]
    """Waiters for a watch thread inside the runner; empty: no thread."""
    parent_death_signal: bool
    watchdog: bool
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        parts: list[str] = []
        if self.thread_chain:
            parts.append(f"{self.thread_chain[0]} thread")
        if self.parent_death_signal:
            parts.append("PR_SET_PDEATHSIG")
        if self.watchdog:
            parts.append("watchdog process")
        return " + ".join(parts) or "nothing"


def plan_watch(strategy: settings.Strategy, capabilities: WatchCapabilities) -> WatchPlan:
    """Which mechanisms to arm. `auto` arms every one that is safe here: a thread for
    the common case, PR_SET_PDEATHSIG and the watchdog for a runner holding the GIL."""
    safe_signal = capabilities.parent_death_signal == "safe"
    signal_note = _PARENT_DEATH_SIGNAL_REASONS[capabilities.parent_death_signal]
    auto = WatchPlan(capabilities.waiters, safe_signal, capabilities.can_fork)
    match strategy:
        case "auto":
            return auto
        case "pidfd" | "kqueue" | "sentinel" | "poll":
            if strategy in capabilities.waiters:
                return WatchPlan((strategy,), parent_death_signal=False, watchdog=False)
            return _with_note(auto, f"the {strategy} waiter is not usable here: using auto")
        case "pdeathsig":
            if safe_signal:
                return WatchPlan((), parent_death_signal=True, watchdog=False)
            fallback = WatchPlan((), False, True) if capabilities.can_fork else auto
            return _with_note(
                fallback,
                f"PR_SET_PDEATHSIG is not safe here ({signal_note}): using {fallback.describe()}",
            )
        case "watchdog":
            if capabilities.can_fork:
                return WatchPlan((), parent_death_signal=False, watchdog=True)
            return _with_note(auto, "cannot fork a watchdog here: using auto")


def _with_note(plan: WatchPlan, note: str) -> WatchPlan:
    return WatchPlan(plan.thread_chain, plan.parent_death_signal, plan.watchdog, (note,))


_active_plan: WatchPlan | None = None


class UnwatchableError(Exception):
    """Nothing says which worker this runner belongs to."""


def guard_runner(**labels: str) -> None:
    """Start the parent watch; call first thing in a runner (top of exo's entrypoint).

    Labels (runner_id, instance_id, ...) go into the log line and the registry record.
    If the worker is already dead the runner exits here. A no-op unless
    EXO_ORPHAN_GUARD is on, a no-op when called twice, and it never raises: on any
    failure it logs a warning and the runner carries on unguarded.
    """
    global _active_plan
    toggle = settings.guard_enabled()
    if toggle.warning is not None:
        warn_once(toggle.warning)
    if not toggle.value or _active_plan is not None:
        return
    try:
        _active_plan = _start_watch(labels)
    except UnwatchableError as error:
        warn_once(f"orphan guard: {error}; this runner is unguarded")
    except Exception as error:  # the guard must never break a runner
        logger.opt(exception=error).warning(
            "orphan guard: could not start the parent watch; this runner is unguarded"
        )


def _start_watch(labels: Mapping[str, str]) -> WatchPlan | None:
    strategy = settings.parse_strategy(os.environ.get(settings.STRATEGY_ENV))
    if strategy.warning is not None:
        warn_once(strategy.warning)
    me = current_identity()
    worker = _recorded_worker()
    if worker is None or liveness(worker) == "gone":
        _die(me, None, "its worker died before the runner was guarded")
    return arm_watch(me, worker, _lead_own_process_group(), labels, strategy.value)


def arm_watch(
    me: ProcessIdentity,
    worker: ProcessIdentity,
    group: int | None,
    labels: Mapping[str, str],
    strategy: settings.Strategy,
) -> WatchPlan:
    """Arm the watch of process `me` (this one) on `worker` and record it.

    `group`: the process group `me` leads, or None. Exits at once (killing the tree)
    if the worker dies while the watch is armed. Raises whatever arming fails with.
    """
    # Everything `me` starts from now on inherits this: proof, later, of what it started.
    os.environ[settings.RUNNER_ENV] = me.encode()
    capabilities = WatchCapabilities(
        waiters=usable_waiters(worker),
        parent_death_signal=_parent_death_signal_safety(worker, me),
        can_fork=hasattr(os, "fork"),
    )
    plan = plan_watch(strategy, capabilities)
    for note in plan.notes:
        logger.warning(f"orphan guard: {note}")

    if plan.parent_death_signal:
        system.set_parent_death_signal(signal.SIGKILL)
        # The worker may have died before the signal was armed: it would never come.
        if liveness(worker) == "gone":
            _die(me, group, "its worker died while the watch was being armed")

    record_path = _record_runner(me, worker, group, labels)
    if plan.watchdog:
        # A forked watchdog inherits no multiprocessing sentinel it could trust.
        chain: tuple[WaiterName, ...] = tuple(
            name for name in capabilities.waiters if name != "sentinel"
        )
        try:
            start_watchdog(worker, me, group, chain, record_path)
        except OSError as error:
            logger.warning(f"orphan guard: could not fork the watchdog ({error})")
            if not plan.thread_chain:
                plan = WatchPlan(capabilities.waiters, plan.parent_death_signal, False)
    if plan.thread_chain:
        threading.Thread(
            target=_watch_in_thread,
            args=(worker, me, group, plan.thread_chain),
            name="exo-orphan-guard-watch",
            daemon=True,
        ).start()

    described = " ".join(f"{key}={value}" for key, value in sorted(labels.items()))
    logger.info(
        f"orphan guard: runner {me.pid} dies with worker {worker.pid} "
        f"({plan.describe()}) {described}".rstrip()
    )
    return plan


def _recorded_worker() -> ProcessIdentity | None:
    """The worker as `prepare_worker()` recorded it; None if it is already gone."""
    raw = os.environ.get(settings.WORKER_ENV, "")
    if raw:
        try:
            return ProcessIdentity.decode(raw)
        except ValueError:
            warn_once(f"orphan guard: ignoring {settings.WORKER_ENV}={raw!r}: not 'pid:start'")
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        raise UnwatchableError(
            "no worker recorded (prepare_worker() was not called) and no multiprocessing parent"
        )
    warn_once("orphan guard: prepare_worker() was not called: watching the spawning parent")
    if os.getppid() != parent.pid:
        return None
    return identity_of(parent.pid)


def _parent_death_signal_safety(worker: ProcessIdentity, me: ProcessIdentity) -> ParentDeathSignal:
    if system.BACKEND != "linux":
        return "unsupported"
    if os.getppid() != worker.pid:
        return "not-worker-child"
    match system.forked_by_main_thread(worker.pid, me.pid):
        case True:
            return "safe"
        case False:
            return "spawned-by-other-thread"
        case None:
            return "unknown"


def _lead_own_process_group() -> int | None:
    """Put the runner and all it will start into one group that can be killed at once."""
    if os.getpgrp() == os.getpid():
        return os.getpid()  # already a leader; setpgid fails for a session leader
    try:
        os.setpgid(0, 0)
    except OSError as error:
        logger.warning(
            f"orphan guard: cannot lead a process group ({error}); "
            "descendants that leave the runner's tree may survive it"
        )
        return None
    _keep_writing_to_the_terminal()
    return os.getpid()


def _keep_writing_to_the_terminal() -> None:
    """Out of the worker's group, the runner is a background job of its terminal: under
    `stty tostop` its first write there would stop it with SIGTTOU, for good once its
    worker is gone. With SIGTTOU ignored the write goes through, as it did in the
    worker's (foreground) group. Nothing changes for a runner without a terminal."""
    if not any(os.isatty(fd) for fd in (1, 2)):
        return
    if threading.current_thread() is not threading.main_thread():
        logger.warning(
            "orphan guard: guard_runner() not called from the main thread: "
            "under `stty tostop` this runner stops at its first write to the terminal"
        )
        return
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)


def _record_runner(
    me: ProcessIdentity, worker: ProcessIdentity, group: int | None, labels: Mapping[str, str]
) -> str | None:
    registry, problem = Registry.open(settings.registry_dir(), create=True)
    if registry is None:
        if problem is not None:
            warn_once(f"{problem}; this runner is not recorded")
        return None
    process = psutil.Process(me.pid)
    try:
        exe: str | None = process.exe()
    except psutil.Error:
        exe = None
    record = RunnerRecord(
        pid=me.pid,
        started=me.started,
        boot_id=system.boot_id(),
        uid=os.geteuid(),
        worker=worker,
        exe=exe,
        argv=tuple(process.cmdline()),
        pgid=group,
        recorded_at=time.time(),
        labels=dict(labels),
    )
    try:
        path = registry.write(record)
    except OSError as error:
        warn_once(f"orphan registry {registry.path}: cannot write a record ({error.strerror})")
        return None
    multiprocessing.util.Finalize(None, registry.remove, args=(path,), exitpriority=0)
    return str(path)


def _watch_in_thread(
    worker: ProcessIdentity, me: ProcessIdentity, group: int | None, chain: tuple[WaiterName, ...]
) -> None:
    wait_for_exit(worker, chain)
    _die(me, group, f"its worker {worker.pid} died")


def _die(me: ProcessIdentity, group: int | None, why: str) -> NoReturn:
    try:
        logger.warning(f"orphan guard: runner {me.pid} exits: {why}")
    finally:
        kill_runner_tree(me, group)
        os._exit(1)
