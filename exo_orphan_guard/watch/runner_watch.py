"""The parent watch: a runner ends, with its tree, when its worker dies.

`watch_plan.plan_watch` decides which mechanisms to arm and how the runner ends;
`guard_runner` probes the system, arms them and records the runner. The ending is
clean when it can be (`clean_ending`: the program's own shutdown on the main thread,
bounded by the watchdog); killing the runner's group at once is what is left when it
cannot (grace 0, no watchdog, not the main thread).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn, final

from loguru import logger

from .. import system
from ..records import endings
from ..records.registry import Registry, RunnerRecord
from ..system import settings
from ..system.identity import ProcessIdentity, current_identity, identity_of, liveness
from ..system.once import warn_once
from . import clean_ending
from .ending_plan import EndingPlan
from .tree_kill import kill_runner_tree
from .waiters import WaiterName, usable_waiters, wait_for_exit
from .watch_plan import ParentDeathSignal, WatchCapabilities, WatchPlan, plan_watch
from .watchdog import start_watchdog

_active_plan: WatchPlan | None = None


class UnwatchableError(Exception):
    """Nothing says which worker this runner belongs to."""


@final
@dataclass(frozen=True, slots=True)
class WatchedRunner:
    """The runner a watch is armed in, as the watchdog and its record need it."""

    me: ProcessIdentity
    worker: ProcessIdentity
    group: int | None
    """The process group `me` leads, or None."""
    labels: Mapping[str, str]
    grace: float
    """How long a clean ending may take once begun (0: none)."""
    busy_wait: float = 0.0
    """How long, from the notice, a main thread in native code is waited for (0: the
    wedge bound, `WEDGE_SECONDS`)."""


def guard_runner(**labels: str) -> None:
    """Start the parent watch; call first thing in a guarded program, on its main thread.

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
    grace = settings.grace_setting()
    if grace.warning is not None:
        warn_once(grace.warning)
    busy_wait = settings.busy_wait_setting()
    if busy_wait.warning is not None:
        warn_once(busy_wait.warning)
    me = current_identity()
    worker = _recorded_worker()
    if worker is None or liveness(worker) == "gone":
        _die(me, None, "its worker died before the runner was guarded")
    group = _lead_own_process_group()
    return arm_watch(me, worker, group, labels, strategy.value, grace.value, busy_wait.value)


def arm_watch(
    me: ProcessIdentity,
    worker: ProcessIdentity,
    group: int | None,
    labels: Mapping[str, str],
    strategy: settings.Strategy,
    grace: float,
    busy_wait: float = 0.0,
) -> WatchPlan:
    """Arm the watch of process `me` (this one) on `worker` and record it.

    `group`: the process group `me` leads, or None. `grace`: how long a clean ending
    may take once begun (0: none, the tree is killed at once). `busy_wait`: how long,
    from the notice, a main thread in native code is waited for (0: `WEDGE_SECONDS`). Exits
    at once (killing the tree) if the worker dies while the watch is armed.
    Raises whatever arming fails with.
    """
    # Everything `me` starts from now on inherits this: proof, later, of what it started.
    os.environ[settings.RUNNER_ENV] = me.encode()
    capabilities = WatchCapabilities(
        waiters=usable_waiters(worker),
        parent_death_signal=_parent_death_signal_safety(worker, me),
        can_fork=hasattr(os, "fork"),
        main_thread=threading.current_thread() is threading.main_thread(),
    )
    plan = plan_watch(strategy, capabilities, grace)
    for note in plan.notes:
        logger.warning(f"orphan guard: {note}")

    registry = _open_registry()
    runner = WatchedRunner(me, worker, group, labels, grace, busy_wait)
    if plan.watchdog and not _fork_watchdog(runner, plan, capabilities, registry):
        plan = plan_watch(strategy, dataclasses.replace(capabilities, can_fork=False), grace)
    if plan.parent_death_signal:
        clean = plan.ending == "clean"
        system.set_parent_death_signal(clean_ending.NOTICE_SIGNAL if clean else signal.SIGKILL)
        # The worker may have died before the signal was armed: it would never come.
        if liveness(worker) == "gone":
            _die(me, group, "its worker died while the watch was being armed")
    if registry is not None:
        record_runner(registry, runner, runner.grace if plan.ending == "clean" else None)
    if plan.thread_chain:
        threading.Thread(
            target=_watch_in_thread,
            args=(worker, me, group, plan),
            name="exo-orphan-guard-watch",
            daemon=True,
        ).start()

    described = " ".join(f"{key}={value}" for key, value in sorted(labels.items()))
    logger.info(
        f"orphan guard: runner {me.pid} dies with worker {worker.pid} "
        f"({plan.describe()}) {described}".rstrip()
    )
    if plan.why_kill and grace > 0:
        logger.warning(f"orphan guard: runner {me.pid} is killed at once: {plan.why_kill}")
    return plan


def _fork_watchdog(
    runner: WatchedRunner,
    plan: WatchPlan,
    capabilities: WatchCapabilities,
    registry: Registry | None,
) -> bool:
    """Start the watchdog (and, for a clean ending, the pipes it learns of it by and
    wakes the runner's heartbeat by); False if fork fails."""
    clean = plan.ending == "clean"
    begun_read, begun_write = os.pipe() if clean else (None, None)
    notice_read, notice_write = os.pipe() if clean else (None, None)
    ending = EndingPlan(
        grace=runner.grace if clean else 0.0,
        begun=begun_read,
        notice=notice_write,
        busy_wait=runner.busy_wait,
        endings_path=None if registry is None else str(registry.path / endings.ENDINGS_NAME),
        boot_id=system.boot_id(),
        labels=dict(runner.labels),
        why_no_clean_ending=plan.why_kill,
    )
    # A forked watchdog inherits no multiprocessing sentinel it could trust.
    chain: tuple[WaiterName, ...] = tuple(
        name for name in capabilities.waiters if name != "sentinel"
    )
    record_path = None if registry is None else str(registry.record_path(runner.me.pid))
    try:
        start_watchdog(runner.worker, runner.me, runner.group, chain, record_path, ending)
    except OSError as error:
        logger.warning(f"orphan guard: could not fork the watchdog ({error})")
        for fd in (begun_write, notice_read):
            if fd is not None:
                os.close(fd)
        return False
    finally:
        for fd in (begun_read, notice_write):
            if fd is not None:
                os.close(fd)
    if begun_write is not None and notice_read is not None:
        clean_ending.install(runner.me, runner.worker, begun_write, runner.grace, notice_read)
    return True


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


def _open_registry() -> Registry | None:
    registry, problem = Registry.open(settings.registry_dir(), create=True)
    if registry is None and problem is not None:
        warn_once(f"{problem}; this runner is not recorded")
    return registry


def record_runner(registry: Registry, runner: WatchedRunner, grace: float | None) -> None:
    """Write `runner`'s record (removed as it exits); `grace`: how long its clean
    ending may take once begun, None without one."""
    me = runner.me
    program = system.exe_and_argv(me.pid)
    if program is None:
        warn_once(f"orphan registry {registry.path}: cannot read this runner's command line")
        return
    exe, argv = program
    record = RunnerRecord(
        pid=me.pid,
        started=me.started,
        boot_id=system.boot_id(),
        uid=os.geteuid(),
        worker=runner.worker,
        exe=exe,
        argv=argv,
        pgid=runner.group,
        recorded_at=time.time(),
        labels=dict(runner.labels),
        grace=grace,
    )
    try:
        path = registry.write(record)
    except OSError as error:
        warn_once(f"orphan registry {registry.path}: cannot write a record ({error.strerror})")
        return
    multiprocessing.util.Finalize(None, registry.remove, args=(path,), exitpriority=0)


def _watch_in_thread(
    worker: ProcessIdentity, me: ProcessIdentity, group: int | None, plan: WatchPlan
) -> None:
    wait_for_exit(worker, plan.thread_chain)
    if plan.ending == "clean":
        clean_ending.notice_main_thread()  # the watchdog bounds what follows
        return
    _die(me, group, f"its worker {worker.pid} died; killed at once: {plan.why_kill}")


def _die(me: ProcessIdentity, group: int | None, why: str) -> NoReturn:
    try:
        logger.warning(f"orphan guard: runner {me.pid} exits: {why}")
        # The watchdog records it too, if it gets there first: one ending, two lines.
        _record_kill(me, why)
    finally:
        kill_runner_tree(me, group)
        os._exit(1)


def _record_kill(me: ProcessIdentity, why: str) -> None:
    endings.record_killed(
        settings.registry_dir(),
        me,
        system.boot_id(),
        by="watch",
        why=why,
        after=0.0,
        step="at_once",
    )
