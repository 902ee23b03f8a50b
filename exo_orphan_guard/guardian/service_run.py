"""`exo-orphan-guard service run`: the guardian, in the foreground (launchd and
systemd run it so; exo's worker may start one).

One per user per machine: it holds `guardian.lock`; a second one says so and waits
for the lock, so `KeepAlive` or `Restart=always` never loops. Holding it, the
guardian:

1. ends what was orphaned while it was not running (a sweep of every process);
2. every scan interval, judges the process table as a sweep does
   (`judging.judge`, its command-line pass replaced by `CheapScan`, which reads only
   what is new and keeps what cannot change of what it describes; or keeps the last
   judgement while it still stands, `judgement`), starts an exit watch on each exo
   process with runners it has not seen (pidfd on Linux, kqueue on macOS, polling on
   the portable backend), and ends any orphan the scan finds (an exo killed between
   two scans);
3. when a watched exo process exits, ends the runners last seen under it at once,
   judging only them (a few milliseconds), then scans again. Runners that hand
   themselves exo's own Shutdown (`handover_marker`) are left alone for the grace
   first, by whichever ending finds them (`_handed`).

Each ending (`endings.end_runners`) judges afresh as a sweep does, so every
never-kill rule holds, and ends through the sweep's engine in a thread of its own: an
exo runner gets SIGINT on its main thread, the busy wait, then SIGKILL; a guarded
runner (recorded) is left to its own watch until its deadline. A target is claimed
by one ending at a time.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import threading
import time
from collections.abc import Collection, Sequence
from types import FrameType
from typing import Final, final

from .._version import __version__
from ..records import handover_marker
from ..records.guardian_state import (
    LOCK_NAME,
    GuardianState,
    Mode,
    clear_state,
    guardian_lock,
    write_state,
)
from ..records.registry import Registry
from ..records.user_dir import user_dir
from ..sweeper.judging import judge
from ..sweeper.sweep_endings import Bounds
from ..sweeper.verdicts import Verdict
from ..system import boot_id, settings
from ..system.identity import ProcessIdentity, current_identity
from ..system.process_facts import Pid
from ..watch.waiters import usable_waiters, wait_for_exit
from . import registry_wait, watchlist
from .cheap_scan import CheapScan
from .endings import KILL_WAIT_SECONDS, OPTIONS, Claims, end_runners
from .judgement import Judgement, named_processes, place_of, still_stands
from .leaving import Leaving, holder_leaving, starting
from .log import say
from .pidfile import PidfileReader
from .stuck import FIRST_RETRY_SCANS, StuckRunners
from .upkeep import UPKEEP_SCANS, upkeep

_IDLE_SCANS_BEFORE_LEAVING: Final = 2
_FULL_SCAN: Final = None


def run(
    mode: Mode = "foreground", *, leave_when_idle: bool = False, watch: Sequence[int] = ()
) -> int:
    """Guard until SIGTERM, SIGINT or SIGHUP (or, `leave_when_idle`, until no exo is
    left to watch); 0, or 2 if the registry cannot be used. Run as a service, it waits
    for the registry instead (`registry_wait`): launchd and systemd would restart an
    exit forever. `watch`: exo processes to watch before they have runners (the worker
    that started this guardian). Started by exo's worker (`mode="worker"`), a guardian
    finding another one guarding leaves at once: no supervisor restarts it, and the
    other one guards; one that is leaving, it waits for (`leaving`)."""
    stop = threading.Event()
    wake: queue.SimpleQueue[ProcessIdentity | None] = queue.SimpleQueue()

    def stopping(_signal_number: int, _frame: FrameType | None) -> None:
        # Nothing printed here: a handler that writes to stderr while the main thread
        # is writing to it raises "reentrant call" there.
        stop.set()
        wake.put(None)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, stopping)

    base = settings.registry_dir()
    if mode == "service":
        registry = registry_wait.wait_for_registry(
            lambda: registry_wait.usable_registry(base), stop, say
        )
        if registry is None:
            say("stopped")
            return 0
    else:
        registry, problem = registry_wait.usable_registry(base)
        if registry is None:
            say(f"cannot guard: {problem}")
            return 2

    home, problem = user_dir(create=False)
    if home is None:  # made by `usable_registry` a moment ago: gone or changed since
        say(f"cannot guard: {problem or 'no guardian directory'}")
        return 2

    lock = home / LOCK_NAME

    def waiting() -> None:
        say(f"another guardian holds {lock}: waiting to take over")

    def keep_waiting() -> bool:
        # No supervisor restarts a worker-started guardian: one that guards is left to.
        if mode != "worker" or holder_leaving(home):
            return True
        say(f"another guardian holds {lock}: leaving it to guard")
        return False

    me = current_identity()
    state = GuardianState(me.pid, me.started, boot_id(), time.time(), mode, __version__)
    try:
        with guardian_lock(home, stop, waiting, keep_waiting) as held:
            if not held:
                return 0
            write_state(home, state)
            try:
                Guardian(stop, wake, Leaving(home, state), leave_when_idle, watch).guard()
            finally:
                # Said before the lock goes, and cleared after: a worker that looks in
                # between finds a guardian leaving (and starts another), never one that
                # seems to guard, nor a lock held with no word of who holds it.
                write_state(home, dataclasses.replace(state, leaving=True))
    finally:
        clear_state(home, state)
    say("stopped")
    return 0


@final
class Guardian:
    def __init__(
        self,
        stop: threading.Event,
        wake: queue.SimpleQueue[ProcessIdentity | None],
        leaving: Leaving,
        leave_when_idle: bool,
        watch: Sequence[int] = (),
    ) -> None:
        self._stop = stop
        self._named = tuple(watch)
        self._leaving = leaving
        self._deaths = wake
        self._leave_when_idle = leave_when_idle
        self._watched: dict[ProcessIdentity, frozenset[ProcessIdentity]] = {}
        self._handing_over: set[ProcessIdentity] = set()
        """Watched exo processes whose runners hand themselves their Shutdown."""
        self._handed: set[ProcessIdentity] = set()
        """Runners last seen under such a process, while they live: whichever ending
        finds them once it is dead (its exit watch, a scan, the start-up sweep reading
        the table late) leaves them alone for the grace first."""
        self._handed_deaths: dict[ProcessIdentity, float] = {}
        """Such processes that died, with when (`time.monotonic()`): a runner one of
        them spawned less than a scan before it died was never seen under it, but it
        started after it, and it is found orphaned within the grace."""
        self._exit_watches: dict[ProcessIdentity, threading.Thread] = {}
        """exo processes with an exit watch under way: one each, whatever their runners."""
        self._claims = Claims()
        self._sightings_problem: str | None = None
        self._sightings = watchlist.Remembering()
        self._base = settings.registry_dir()
        """Where its registry is: its environment does not change while it runs."""
        self._cheap_scan = CheapScan()
        self._judgement: Judgement | None = None
        """The last scan's judgement, kept while it still stands (`judgement`)."""
        self._pidfile = PidfileReader(settings.exo_pidfile())
        self._pidfile_hangs = False
        self._lock = threading.Lock()
        self._endings: list[threading.Thread] = []
        interval = settings.scan_interval_setting()
        busy = settings.busy_wait_setting()
        grace = settings.grace_setting()
        for warning in (interval.warning, busy.warning, grace.warning):
            if warning is not None:
                say(warning)
        self._interval = interval.value
        self._stuck = StuckRunners(FIRST_RETRY_SCANS * self._interval)
        self._bounds = Bounds(
            grace=grace.value,
            interrupt_wait=settings.interrupt_bound(busy.value, grace.value),
            kill_wait=KILL_WAIT_SECONDS,
        )

    def guard(self) -> None:
        say(
            f"watching for exo processes of uid {os.geteuid()} (pid {os.getpid()}, "
            f"scan every {self._interval:g} s, "
            f"SIGKILL {self._bounds.interrupt_wait:g} s after SIGINT, "
            f"registry {self._base})"
        )
        self._end(_FULL_SCAN, "start-up sweep")
        idle_scans = 0
        scans = 0
        next_scan = time.monotonic()
        while not self._stop.is_set():
            try:
                dead = self._deaths.get(timeout=max(0.0, next_scan - time.monotonic()))
            except queue.Empty:
                dead = None
            if dead is not None:
                runners, handover = self._forget(dead)
                if runners:
                    grace = self._bounds.grace
                    first = f"the grace ({grace:g} s) to take their own Shutdown, then "
                    say(
                        f"exo {dead.pid} exited: ending its {len(runners)} runner(s): "
                        f"{first if handover and grace > 0 else ''}SIGINT"
                    )
                    self._end([runner.pid for runner in runners], f"exo {dead.pid} exited")
                handover_marker.remove(self._base, dead.pid)
                next_scan = time.monotonic()  # runners started since the last scan
                continue
            if self._stop.is_set() or time.monotonic() < next_scan:
                continue
            self._scan()
            self._chores(scans)
            scans += 1
            next_scan = time.monotonic() + self._interval
            idle_scans = 0 if self._busy() else idle_scans + 1
            if self._leave_when_idle and idle_scans >= _IDLE_SCANS_BEFORE_LEAVING:
                if self._leaving.may_leave():
                    say("no exo process left to watch: leaving")
                    return
                idle_scans = 0  # an exo asked to be watched: the next scan watches it
                next_scan = time.monotonic()
        say("stopping")

    def _chores(self, scans: int) -> None:
        """After scan number `scans`: stuck runners now gone are said, and every
        `UPKEEP_SCANS` scans the guardian's files are kept bounded (`upkeep`)."""
        for runner in self._stuck.gone():
            say(f"runner {runner.pid}, stuck in the kernel after SIGKILL, is gone now")
        if scans % UPKEEP_SCANS == 0:
            home = self._leaving.home
            upkeep(self._base, home, boot_id(), time.time(), time.monotonic())

    def _busy(self) -> bool:
        with self._lock:
            self._endings = [thread for thread in self._endings if thread.is_alive()]
            starting = self._judgement is not None and self._judgement.starting
            return bool(self._watched or self._endings or starting)

    def _scan(self) -> None:
        scan = self._cheap_scan
        candidates = scan.candidates()
        named_pids = (*self._named, *self._in_pidfile(), *self._leaving.requested())
        with self._lock:
            watched = set(self._watched)
            exit_watched = {exo for exo, watch in self._exit_watches.items() if watch.is_alive()}
        last = self._judgement
        now = (candidates, scan.unchanged, named_pids, watched, exit_watched)
        if last is None or not still_stands(last, *now, place_of(last.registry)):
            last = self._judgement = self._judge(candidates, named_pids)
        table, verdicts, named, found = last.table, last.verdicts, last.named, last.found
        starts = {info.identity: info.create_time for info in (*table.processes.values(), *named)}
        handing_over = {
            exo
            for exo in found
            if exo in starts and handover_marker.hands_over(self._base, exo.pid, starts[exo])
        }
        with self._lock:
            # Said of an exo already watched: its marker came after its first scan.
            newly_handing = (handing_over - self._handing_over) & set(self._watched)
            self._handing_over = (self._handing_over & set(found)) | handing_over
            listed = {info.identity for info in table.processes.values() if not info.exited}
            self._handed = {runner for runner in self._handed if runner in listed} | {
                runner for process in self._handing_over for runner in found[process]
            }
            new = watchlist.newly_watched(self._watched, found)
            self._watched = dict(found)
            for process in (process for process in new if process not in self._exit_watches):
                watch = threading.Thread(
                    target=self._watch_exit,
                    args=(process,),
                    name=f"exit-{process.pid}",
                    daemon=True,
                )
                self._exit_watches[process] = watch
                watch.start()
        for process in new:
            handover = ", which hand themselves their Shutdown" if process in handing_over else ""
            say(f"watching exo {process.pid} ({len(found[process])} runner(s){handover})")
        for process in newly_handing:
            say(f"exo {process.pid}: its runners hand themselves their Shutdown (its marker)")
        taken = self._claims.taken() | self._stuck.resting(time.monotonic())
        orphans = [
            verdict.pid
            for verdict in verdicts
            if verdict.action == "kill"
            and verdict.process is not None
            and verdict.process.identity not in taken
        ]
        if orphans:
            self._end(orphans, "orphans found by a scan")

    def _judge(self, candidates: frozenset[Pid], named_pids: tuple[int, ...]) -> Judgement:
        """The table judged as a sweep judges it, and what it shows remembered."""
        registry, _ = Registry.open(self._base, create=False)
        directories = (self._base,) if registry is None else (self._base, registry.path)
        place, scan = place_of(directories), self._cheap_scan  # before the records are read
        table, verdicts = judge(registry, OPTIONS, [], candidates, scan.memo, scan.seen)
        named = named_processes(table, named_pids)
        found = watchlist.exo_processes(table, verdicts, named)
        if registry is not None:  # before any exit watch: its ending judges by them
            problem = self._sightings.remember(registry.path, table, found)
            if problem is not None and problem != self._sightings_problem:
                say(problem)
            self._sightings_problem = problem
        young = starting(verdicts, time.time())
        judged = (table, verdicts, tuple(named), found, candidates, named_pids, young)
        return Judgement(*judged, directories, place)

    def _in_pidfile(self) -> tuple[int, ...]:
        """The pid in exo's pidfile (exo main writes one; releases and the app before
        it do not), as the read before this scan found it (`pidfile`)."""
        pid, answered = self._pidfile.pid()
        if answered == self._pidfile_hangs:
            path = self._pidfile.path
            say(
                f"exo's pidfile {path} answers again"
                if answered
                else f"exo's pidfile {path} does not answer: scanning without it until it does"
            )
        self._pidfile_hangs = not answered
        return () if pid is None else (pid,)

    def _watch_exit(self, process: ProcessIdentity) -> None:
        wait_for_exit(process, usable_waiters(process))
        self._deaths.put(process)

    def _forget(self, process: ProcessIdentity) -> tuple[frozenset[ProcessIdentity], bool]:
        """The runners last seen under `process`, and whether they hand themselves
        their Shutdown; it is watched no more."""
        with self._lock:
            self._exit_watches.pop(process, None)
            handover = process in self._handing_over
            self._handing_over.discard(process)
            if handover:
                self._handed_deaths[process] = time.monotonic()
            return self._watched.pop(process, frozenset()), handover

    def _handed_now(self, verdicts: Sequence[Verdict]) -> set[ProcessIdentity]:
        """The targets among `verdicts` that hand themselves exo's own Shutdown: seen
        under a process whose hooks do, or started after one that died less than the
        grace ago (spawned too late to be seen: the grace first only delays it)."""
        now = time.monotonic()
        with self._lock:
            self._handed_deaths = {
                process: died
                for process, died in self._handed_deaths.items()
                if now - died < self._bounds.grace
            }
            handed = set(self._handed)
            recent = list(self._handed_deaths)
        for verdict in verdicts:
            process = verdict.process
            if verdict.action != "kill" or process is None:
                continue
            if any(process.started >= died.started for died in recent):
                handed.add(process.identity)
        return handed

    def _end(self, candidates: Collection[int] | None, why: str) -> None:
        """End what the sweep's verdicts mark among `candidates` (None: every process),
        in a thread of its own."""
        if candidates is not None and not candidates:
            return
        thread = threading.Thread(
            target=end_runners,
            args=(candidates, why),
            kwargs={
                "bounds": self._bounds,
                "claims": self._claims,
                "handed": self._handed_now,
                "stuck": self._stuck,
                "stop": self._stop,
                "say": say,
            },
            name="ending",
            daemon=True,
        )
        with self._lock:
            self._endings.append(thread)
        thread.start()
