"""`exo-orphan-guard service run`: the guardian, in the foreground (launchd and
systemd run it so; exo's worker may start one).

One per user per machine: it holds `guardian.lock`; a second one says so and waits
for the lock, so `KeepAlive` or `Restart=always` never loops. Holding it, the
guardian:

1. ends what was orphaned while it was not running (a sweep of every process);
2. every scan interval, judges the process table as a sweep does
   (`judging.judge`, its command-line pass replaced by `CheapScan`, which reads only
   what is new), starts an exit watch on each exo process with runners it has not
   seen (pidfd on Linux, kqueue on macOS, polling on the portable backend), and ends
   any orphan the scan finds (an exo killed between two scans);
3. when a watched exo process exits, ends the runners last seen under it at once,
   judging only them (a few milliseconds), then scans again. An exo whose hooks hand
   its runners their own Shutdown (`handover_marker`) has them left alone for the
   grace first, so that no SIGINT cuts exo's own `Runner.shutdown` short: by
   whichever ending finds them, since a scan or the start-up sweep may read the
   table after that exo died and act before its exit watch does.

Each ending is a sweep without the registry's lock (`SweepRequest.locked`), in a
thread of its own, so that a busy runner's wait never delays another exo's: an exo
runner gets SIGINT (KeyboardInterrupt unwinds it through Python), the busy wait,
then SIGKILL; a guarded runner (recorded) is left to its own watch until its
deadline, as a sweep leaves it. The verdicts are the sweep's, so every never-kill
rule holds. A target is claimed by one ending at a time.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Final, final

from .._version import __version__
from ..records import handover_marker
from ..records.endings import How
from ..records.guardian_state import GuardianState, Mode, clear_state, guardian_lock, write_state
from ..records.registry import Registry
from ..sweeper.judging import judge
from ..sweeper.killing import KillResult
from ..sweeper.process_table import ProcessInfo, ProcessTable, gather
from ..sweeper.sweeping import SweepRequest, run_sweep
from ..sweeper.verdicts import SweepOptions
from ..system import boot_id, settings
from ..system.identity import ProcessIdentity, current_identity
from ..system.process_facts import Pid
from ..watch.waiters import usable_waiters, wait_for_exit
from . import watchlist
from .cheap_scan import CheapScan

KILL_WAIT_SECONDS: Final = 2.0
_IDLE_SCANS_BEFORE_LEAVING: Final = 2
_FULL_SCAN: Final = None
_OPTIONS: Final = SweepOptions(fingerprint=True)


def say(line: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{stamp} exo-orphan-guard guardian: {line}", file=sys.stderr, flush=True)


def run(
    mode: Mode = "foreground", *, leave_when_idle: bool = False, watch: Sequence[int] = ()
) -> int:
    """Guard until SIGTERM, SIGINT or SIGHUP (or, `leave_when_idle`, until no exo is
    left to watch); 0, or 2 if the registry cannot be opened. `watch`: exo processes
    to watch before they have runners (the worker that started this guardian). Started
    by exo's worker (`mode="worker"`), a guardian finding another one running leaves
    at once: no supervisor restarts it, and the other one guards."""
    base = settings.registry_dir()
    registry, problem = Registry.open(base, create=True)
    if registry is None:
        say(f"cannot guard: {problem or f'no registry at {base}'}")
        return 2
    stop = threading.Event()
    wake: queue.SimpleQueue[ProcessIdentity | None] = queue.SimpleQueue()

    def stopping(_signal_number: int, _frame: FrameType | None) -> None:
        # Nothing printed here: a handler that writes to stderr while the main thread
        # is writing to it raises "reentrant call" there.
        stop.set()
        wake.put(None)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, stopping)

    def waiting() -> None:
        if mode == "worker":
            say(f"another guardian holds {registry.path / 'guardian.lock'}: leaving it to guard")
            stop.set()
        else:
            say(f"another guardian holds {registry.path / 'guardian.lock'}: waiting to take over")

    with guardian_lock(registry.path, stop, waiting) as held:
        if not held:
            return 0
        me = current_identity()
        state = GuardianState(me.pid, me.started, boot_id(), time.time(), mode, __version__)
        write_state(registry.path, state)
        try:
            Guardian(stop, wake, leave_when_idle, watch).guard()
        finally:
            clear_state(registry.path, state)
    say("stopped")
    return 0


@final
class Guardian:
    def __init__(
        self,
        stop: threading.Event,
        wake: queue.SimpleQueue[ProcessIdentity | None],
        leave_when_idle: bool,
        watch: Sequence[int] = (),
    ) -> None:
        self._stop = stop
        self._named = tuple(watch)
        self._deaths = wake
        self._leave_when_idle = leave_when_idle
        self._watched: dict[ProcessIdentity, frozenset[ProcessIdentity]] = {}
        self._handing_over: set[ProcessIdentity] = set()
        """Watched exo processes whose runners hand themselves their Shutdown."""
        self._handed: set[ProcessIdentity] = set()
        """Runners last seen under such a process, while they live: whichever ending
        finds them once it is dead (its exit watch, a scan, the start-up sweep reading
        the table late) leaves them alone for the grace first."""
        self._exit_watches: set[ProcessIdentity] = set()
        """exo processes with an exit watch under way: one each, however often they
        lose and regain runners (a model unloaded, another loaded)."""
        self._claimed: set[ProcessIdentity] = set()
        self._cheap_scan = CheapScan()
        self._lock = threading.Lock()
        self._endings: list[threading.Thread] = []
        interval = settings.scan_interval_setting()
        busy = settings.busy_wait_setting()
        grace = settings.grace_setting()
        for warning in (interval.warning, busy.warning, grace.warning):
            if warning is not None:
                say(warning)
        self._interval = interval.value
        self._grace = grace.value
        self._interrupt_wait = settings.interrupt_bound(busy.value, grace.value)

    def guard(self) -> None:
        say(
            f"watching for exo processes of uid {os.geteuid()} (pid {os.getpid()}, "
            f"scan every {self._interval:g} s, SIGKILL {self._interrupt_wait:g} s after SIGINT, "
            f"registry {settings.registry_dir()})"
        )
        self._end(_FULL_SCAN, "start-up sweep")
        idle_scans = 0
        next_scan = time.monotonic()
        while not self._stop.is_set():
            try:
                dead = self._deaths.get(timeout=max(0.0, next_scan - time.monotonic()))
            except queue.Empty:
                dead = None
            if dead is not None:
                runners, handover = self._forget(dead)
                if runners:
                    first = f"the grace ({self._grace:g} s) to take their own Shutdown, then "
                    say(
                        f"exo {dead.pid} exited: ending its {len(runners)} runner(s): "
                        f"{first if handover else ''}SIGINT"
                    )
                    pids = [runner.pid for runner in runners]
                    self._end(pids, f"exo {dead.pid} exited", self._grace if handover else 0.0)
                handover_marker.remove(settings.registry_dir(), dead.pid)
                next_scan = time.monotonic()  # runners started since the last scan
                continue
            if self._stop.is_set() or time.monotonic() < next_scan:
                continue
            self._scan()
            next_scan = time.monotonic() + self._interval
            idle_scans = 0 if self._busy() else idle_scans + 1
            if self._leave_when_idle and idle_scans >= _IDLE_SCANS_BEFORE_LEAVING:
                say("no exo process left to watch: leaving")
                return
        say("stopping")

    def _busy(self) -> bool:
        with self._lock:
            self._endings = [thread for thread in self._endings if thread.is_alive()]
            return bool(self._watched or self._endings)

    def _scan(self) -> None:
        warnings: list[str] = []
        base = settings.registry_dir()
        registry, _ = Registry.open(base, create=False)
        table, verdicts = judge(registry, _OPTIONS, warnings, self._cheap_scan.candidates())
        named = _named(table, (*self._named, *_pid_in_pidfile()))
        found = watchlist.exo_processes(table, verdicts, named)
        starts = {info.identity: info.create_time for info in (*table.processes.values(), *named)}
        handing_over = {
            process
            for process in found
            if process in starts and handover_marker.hands_over(base, process.pid, starts[process])
        }
        with self._lock:
            self._handing_over = (self._handing_over & set(found)) | handing_over
            listed = {info.identity for info in table.processes.values() if not info.exited}
            self._handed = {runner for runner in self._handed if runner in listed} | {
                runner for process in self._handing_over for runner in found[process]
            }
            new = watchlist.newly_watched(self._watched, found)
            self._watched = dict(found)
            claimed = set(self._claimed)
            unwatched = [process for process in new if process not in self._exit_watches]
            self._exit_watches.update(unwatched)
        for process in new:
            handover = ", which hand themselves their Shutdown" if process in handing_over else ""
            say(f"watching exo {process.pid} ({len(found[process])} runner(s){handover})")
        for process in unwatched:
            threading.Thread(
                target=self._watch_exit, args=(process,), name=f"exit-{process.pid}", daemon=True
            ).start()
        orphans = [
            verdict.pid
            for verdict in verdicts
            if verdict.action == "kill"
            and verdict.process is not None
            and verdict.process.identity not in claimed
        ]
        if orphans:
            self._end(orphans, "orphans found by a scan")

    def _watch_exit(self, process: ProcessIdentity) -> None:
        wait_for_exit(process, usable_waiters(process))
        self._deaths.put(process)

    def _forget(self, process: ProcessIdentity) -> tuple[frozenset[ProcessIdentity], bool]:
        """The runners last seen under `process`, and whether they hand themselves
        their Shutdown; it is watched no more."""
        with self._lock:
            self._exit_watches.discard(process)
            handover = process in self._handing_over
            self._handing_over.discard(process)
            return self._watched.pop(process, frozenset()), handover

    def _end(
        self, candidates: Collection[int] | None, why: str, handover_wait: float = 0.0
    ) -> None:
        """End what the sweep's verdicts mark among `candidates` (None: every process),
        in a thread of its own; `handover_wait`: see `SweepRequest`."""
        if candidates is not None and not candidates:
            return
        thread = threading.Thread(
            target=self._ending,
            args=(candidates, why, handover_wait),
            name="ending",
            daemon=True,
        )
        with self._lock:
            self._endings.append(thread)
        thread.start()

    def _ending(self, candidates: Collection[int] | None, why: str, handover_wait: float) -> None:
        mine: list[ProcessIdentity] = []

        def claim(targets: Sequence[ProcessIdentity]) -> Collection[ProcessIdentity]:
            with self._lock:
                free = [target for target in targets if target not in self._claimed]
                handed: list[ProcessIdentity] = []
                if handover_wait <= 0 < self._grace:
                    handed = [target for target in free if target in self._handed]
                    free = [target for target in free if target not in handed]
                self._claimed.update(free)
            mine.extend(free)
            if handed:  # an ending of its own, with the grace first
                pids = [target.pid for target in handed]
                self._end(pids, f"{why}: runners handed their own Shutdown", self._grace)
            return free

        request = SweepRequest(
            options=_OPTIONS,
            dry_run=False,
            registry_dir=None,
            grace=self._grace,
            kill_wait=KILL_WAIT_SECONDS,
            lock_timeout=0.0,
            on_wait=say,
            stop=self._stop,
            interrupt_wait=self._interrupt_wait,
            by="guardian",
            locked=False,
            candidates=None if candidates is None else frozenset(candidates),
            claim=claim,
            handover_wait=handover_wait,
        )
        try:
            report = run_sweep(request, [], time.monotonic())
            for warning in report.warnings:
                say(f"{why}: {warning}")
            for result in report.results:
                say(f"{why}: {describe(result)}")
        finally:
            with self._lock:
                self._claimed.difference_update(mine)


def describe(result: KillResult) -> str:
    how: How | None = result.ended
    if result.outcome == "unkillable":
        return f"runner {result.target.pid} survived SIGKILL: {result.advice}"
    by = result.last_signal or "no signal"
    return f"runner {result.target.pid} ended {how} ({', '.join(result.signals) or by})"


def _pid_in_pidfile() -> tuple[int, ...]:
    """exo main writes one; releases and the app before it do not."""
    pid = read_pidfile(settings.exo_pidfile())
    return () if pid is None else (pid,)


def _named(table: ProcessTable, pids: Sequence[int]) -> list[ProcessInfo]:
    """The processes named to be watched (by exo's pidfile, by `--watch`) that are
    alive: from `table`, or read now."""
    unlisted = [pid for pid in pids if Pid(pid) not in table.processes]
    read: Mapping[Pid, ProcessInfo] = (
        gather(unlisted, fingerprint=False, match=None).processes if unlisted else {}
    )
    found = [table.processes.get(Pid(pid)) or read.get(Pid(pid)) for pid in pids]
    return [info for info in found if info is not None]


def read_pidfile(path: Path) -> int | None:
    """The pid in exo's pidfile, read without its lock; None if there is none."""
    with contextlib.suppress(OSError, ValueError):
        with open(path, "rb") as file:
            words = file.read(64).split()
        pid = int(words[0]) if words else 0
        return pid if pid > 1 else None
    return None
