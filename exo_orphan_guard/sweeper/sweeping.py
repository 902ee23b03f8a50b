"""The startup sweep: find runners that outlived their worker and kill them.

`sweep()` locks the registry, reads it, snapshots the process table, lets
`verdicts.decide` judge, then acts: kills targets (`killing`), deletes stale records.
`sweep_async()` runs the same in a worker thread for an event loop, and stops it
(`stop`) when the task awaiting it is cancelled.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, ParamSpec, final

from ..records import endings
from ..records.endings import By
from ..records.freeze_journal import FreezeJournal, thaw_abandoned
from ..records.registry import LockUnavailableError, Registry
from ..system import settings
from ..system.identity import ProcessIdentity, current_identity
from ..system.process_facts import Pid
from . import killing, sweep_endings
from .judging import judge, sweep_options
from .killing import KillResult
from .process_table import ProcessTable
from .sweep_report import SweepReport
from .verdicts import SweepOptions, Verdict

P = ParamSpec("P")

DEFAULT_KILL_WAIT_SECONDS: Final = 2.0
DEFAULT_LOCK_TIMEOUT_SECONDS: Final = 15.0
_PASSES: Final = 2


@final
@dataclass(frozen=True, slots=True)
class SweepRequest:
    """What one sweep was asked to do, checked (`sweep`) and passed along whole."""

    options: SweepOptions
    """What to judge a target."""
    dry_run: bool
    registry_dir: Path | None
    """None: EXO_ORPHAN_GUARD_DIR, else ~/.exo/orphan-guard."""
    grace: float
    """Seconds between SIGTERM and SIGKILL."""
    kill_wait: float
    """Seconds to wait for a SIGKILLed process to be gone."""
    lock_timeout: float
    on_wait: Callable[[str], None] | None = None
    """Told one line for each runner the sweep waits for: which, why, until when."""
    wait_for_endings: bool = True
    """False (`sweep --now`): no waiting for runners already ending by themselves."""
    stop: threading.Event | None = None
    """Once set, the sweep waits no more: not for the lock, nor for a runner ending
    by itself (left to its watchdog)."""
    interrupt_wait: float | None = None
    """Seconds an unrecorded exo runner has after SIGINT before SIGKILL; None: it gets
    SIGTERM and the grace (the sweeps inside exo's worker, until the series moves
    its bounds outside)."""
    by: By = "sweep"
    """Who its endings lines name."""
    locked: bool = True
    """False (the guardian's endings): no registry lock, no freezing, no record
    removed; targets another sweeper has begun to end are waited for, not signalled."""
    candidates: Collection[int] | None = None
    """The only pids looked at for the fingerprint rule (`process_table.gather`)."""
    claim: Callable[[Sequence[ProcessIdentity]], Collection[ProcessIdentity]] | None = None
    """Told the targets about to be acted on; answers those this sweep may act on."""
    handover_wait: float = 0.0
    """Seconds an unrecorded exo runner is left alone first: its worker's hooks hand it
    exo's own Shutdown (`handover_marker`), and a SIGINT would cut that short."""


def sweep(
    *,
    dry_run: bool = False,
    registry_dir: Path | None = None,
    grace: float | None = None,
    kill_wait: float = DEFAULT_KILL_WAIT_SECONDS,
    fingerprint: bool = True,
    match: str | re.Pattern[str] | None = None,
    any_parent: bool = False,
    all_users: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
    on_wait: Callable[[str], None] | None = None,
    wait_for_endings: bool = True,
    stop: threading.Event | None = None,
    interrupt: bool = False,
) -> SweepReport:
    """Kill runners whose worker is dead; spare everything else.

    Targets: recorded runners whose recorded worker is gone, and what they provably
    started; with `fingerprint`, exo spawn children whose spawner is gone; with
    `match`, processes whose command line matches and that were reparented (or, with
    `any_parent`, any). Never: this process, its ancestors and descendants, another
    exo-orphan-guard process, other users' processes (unless `all_users`, root only),
    a process whose start time or command line differs from its record, a process it
    cannot read.

    `grace` (default EXO_ORPHAN_GUARD_GRACE, else 10 s) separates SIGTERM from SIGKILL;
    a recorded runner already ending the clean way, or busy in native code, is first
    waited for, until its watchdog would kill it (`wait_for_endings=False`: not at
    all); `on_wait` gets one line for each wait, saying which, why and until when.
    `stop`, set from another thread, ends every wait: for the lock (nothing done), for
    a runner ending by itself (left to its watchdog, in `left_to_end`).
    `interrupt`: an unrecorded exo runner gets SIGINT instead of SIGTERM, and the busy
    wait (EXO_ORPHAN_GUARD_BUSY_WAIT, never less than the grace; with
    `wait_for_endings=False`, the grace) to exit before SIGKILL.
    Raises ValueError for a bad `match`, `any_parent` without `match`, or `all_users`
    without root; everything else wrong (unreadable registry, corrupt records, racing
    processes) becomes a warning in the report.
    """
    started = time.monotonic()
    options = sweep_options(fingerprint, match, any_parent, all_users)
    warnings: list[str] = []
    if grace is None:
        parsed = settings.grace_setting()
        grace = parsed.value
        if parsed.warning is not None:
            warnings.append(parsed.warning)
    interrupt_wait: float | None = None
    if interrupt:
        busy = settings.busy_wait_setting()
        if busy.warning is not None:
            warnings.append(busy.warning)
        interrupt_wait = settings.interrupt_bound(busy.value, grace) if wait_for_endings else grace
    request = SweepRequest(
        options,
        dry_run,
        registry_dir,
        grace,
        kill_wait,
        lock_timeout,
        on_wait,
        wait_for_endings,
        stop,
        interrupt_wait,
    )
    return run_sweep(request, warnings, started)


def run_sweep(request: SweepRequest, warnings: list[str], started: float) -> SweepReport:
    """`sweep` of a request already made: each registry directory in turn."""
    registry_dir = request.registry_dir
    if registry_dir is not None:
        return _run(request, warnings, started)
    # Also the registry from before EXO_HOME counted, while it holds anything.
    current, *former = settings.registry_dirs()
    report = _run(replace(request, registry_dir=current), warnings, started)
    for path in former:
        if path.is_dir():
            earlier = replace(request, registry_dir=path)
            report = report.merged(_run(earlier, [], time.monotonic()))
    return report


def _run(request: SweepRequest, warnings: list[str], started: float) -> SweepReport:
    path = request.registry_dir if request.registry_dir is not None else settings.registry_dir()
    registry, problem = Registry.open(path, create=not request.dry_run)
    if problem is not None:
        warnings.append(problem)

    def report(outcome: _Outcome, locked: bool = True) -> SweepReport:
        return SweepReport(
            verdicts=outcome.verdicts,
            results=outcome.results,
            warnings=tuple(warnings),
            dry_run=request.dry_run,
            registry=None if registry is None else registry.path,
            elapsed_seconds=time.monotonic() - started,
            lock_acquired=locked,
            would_signal=outcome.would_signal,
            other_users_spared=sum(
                verdict.action == "spare"
                and verdict.process is not None
                and verdict.process.uid != os.geteuid()
                for verdict in outcome.verdicts
            ),
            continued=outcome.continued,
            target_endings=outcome.target_endings,
            left_to_end=outcome.left_to_end,
        )

    if request.dry_run:
        table, verdicts = judge(registry, request.options, warnings, request.candidates)
        targets = _targets(verdicts)
        latest = _latest_endings(registry, table.boot_id)
        return report(
            _Outcome(
                verdicts,
                (),
                killing.preview(targets, table.protected),
                target_endings={t: latest[t] for t in targets if t in latest},
            )
        )
    if registry is None or not request.locked:
        return report(_kill_orphans(registry, request, warnings))
    try:
        with registry.locked(request.lock_timeout, request.stop) as acquired:
            if not acquired:
                return report(_Outcome((), ()), locked=False)
            registry.remove_stale_temporaries(time.time())
            return report(_kill_orphans(registry, request, warnings))
    except LockUnavailableError as error:
        warnings.append(f"{error.strerror}: sweeping without it")
    return report(_kill_orphans(registry, request, warnings))


@final
@dataclass(frozen=True, slots=True)
class _Outcome:
    verdicts: tuple[Verdict, ...]
    results: tuple[KillResult, ...]
    would_signal: Mapping[Pid, tuple[Pid, ...]] = field(default_factory=dict[Pid, tuple[Pid, ...]])
    continued: tuple[ProcessIdentity, ...] = ()
    target_endings: Mapping[ProcessIdentity, endings.Ending] = field(
        default_factory=dict[ProcessIdentity, endings.Ending]
    )
    left_to_end: tuple[ProcessIdentity, ...] = ()


def _kill_orphans(
    registry: Registry | None, request: SweepRequest, warnings: list[str]
) -> _Outcome:
    """Judge and act; once more if a recorded runner that led its own process group
    went meanwhile, so that what it left in its group is judged on the same records
    (a runner can die between the snapshot and the kill, its children reparented
    out of reach of the tree walk)."""
    continued: list[ProcessIdentity] = []
    journal: FreezeJournal | None = None
    if registry is not None and request.locked:
        continued = thaw_abandoned(registry.path)
        journal = FreezeJournal.create(registry.path, current_identity())
    verdicts: list[Verdict] = []
    results: list[KillResult] = []
    left_to_end: list[ProcessIdentity] = []
    try:
        for _ in range(_PASSES):
            table, judged = judge(registry, request.options, warnings, request.candidates)
            acted = _act(registry, table, judged, request, journal)
            seen = {(verdict.pid, verdict.action) for verdict in verdicts}
            verdicts.extend(v for v in judged if (v.pid, v.action) not in seen)
            results.extend(acted)
            left_to_end = _not_acted_on(judged, acted)
            if left_to_end or not _left_groups(judged, acted):
                break
    finally:
        if journal is not None:
            journal.close()
    return _Outcome(
        tuple(verdicts), tuple(results), continued=tuple(continued), left_to_end=tuple(left_to_end)
    )


def _not_acted_on(
    verdicts: Sequence[Verdict], results: Sequence[KillResult]
) -> list[ProcessIdentity]:
    """Targets without a result: runners the sweep stopped waiting for (`stop`)."""
    acted_on = {result.target for result in results}
    return [target for target in _targets(verdicts) if target not in acted_on]


def _left_groups(verdicts: Sequence[Verdict], results: Sequence[KillResult]) -> bool:
    """Whether a recorded runner that led its own group went during this pass."""
    gone = {result.target.pid for result in results if result.outcome != "unkillable"}
    return any(
        verdict.again
        or (
            verdict.rule == "registry"
            and verdict.pid in gone
            and verdict.record is not None
            and verdict.record.record.pgid == verdict.record.record.pid
        )
        for verdict in verdicts
    )


def _in_worker_thread(function: Callable[P, SweepReport]) -> Callable[P, Awaitable[SweepReport]]:
    async def run(*args: P.args, **kwargs: P.kwargs) -> SweepReport:
        import anyio.to_thread  # only an event loop needs it: the CLI starts without

        stop = threading.Event()
        call = functools.partial(function, *args, **kwargs, stop=stop)
        try:
            # Abandoned on cancellation, and told to stop: the caller's shutdown must not
            # wait out a busy runner's wait.
            return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        finally:
            stop.set()

    return run


sweep_async = _in_worker_thread(sweep)
"""`sweep()` in a worker thread, so the caller's event loop keeps running meanwhile. If
the awaiting task is cancelled, the cancellation goes through at once, and the sweep,
told to stop, waits no more: a runner it was waiting for it leaves to its watchdog, the
lock it was waiting for it gives up. A kill under way (SIGTERM, the grace, SIGKILL) it
finishes in the background."""


def _targets(verdicts: Sequence[Verdict]) -> list[ProcessIdentity]:
    return [
        verdict.process.identity
        for verdict in verdicts
        if verdict.action == "kill" and verdict.process is not None
    ]


def _act(
    registry: Registry | None,
    table: ProcessTable,
    verdicts: Sequence[Verdict],
    request: SweepRequest,
    journal: FreezeJournal | None,
) -> list[KillResult]:
    began = time.monotonic()
    targets = _targets(verdicts)
    if request.claim is not None:
        allowed = request.claim(targets)
        targets = [target for target in targets if target in allowed]
    before = _latest_endings(registry, table.boot_id)
    waits = sweep_endings.patience(verdicts, before, began) if request.wait_for_endings else {}
    waits = {target: deadline for target, deadline in waits.items() if target in targets}
    if request.handover_wait > 0:
        for target in sweep_endings.handed_over(verdicts, targets, waits):
            waits[target] = began + request.handover_wait
    steps = sweep_endings.first_steps(verdicts, request.grace, request.interrupt_wait)
    if registry is not None:
        at_once = {t: step for t, step in steps.items() if t in targets and t not in waits}
        sweep_endings.write_begun(
            registry.path / endings.ENDINGS_NAME, at_once, table.boot_id, request.by
        )
    announce = request.on_wait
    if announce is not None:
        for line in sweep_endings.wait_lines(verdicts, waits, before, began, time.time()):
            announce(line)

    def renew(target: ProcessIdentity) -> float | None:
        """A deadline out: wait on if the watchdog has since recorded a later one (a
        runner busy in native code is recorded so 0.5 s after the notice)."""
        recorded = _latest_endings(registry, table.boot_id).get(target)
        now = time.monotonic()
        later = endings.recorded_deadline(recorded, now)
        if later is not None and announce is not None and recorded is not None:
            for line in sweep_endings.wait_lines(
                verdicts, {target: later}, {target: recorded}, now, time.time()
            ):
                announce(line)
        return later

    results = killing.execute(
        targets,
        table.protected,
        steps,
        request.kill_wait,
        journal,
        waits,
        renew,
        request.stop,
    )
    # Read again: watchdogs recorded how the runners waited for ended.
    latest = _latest_endings(registry, table.boot_id)
    results = sweep_endings.with_endings(results, verdicts, latest)
    if registry is not None:
        path = registry.path / endings.ENDINGS_NAME
        sweep_endings.write(path, results, latest, table.boot_id, began, request.by)
        if not request.locked:
            return results
        endings.compact(path, table.boot_id)
        left = {result.target.pid for result in results if result.outcome == "unkillable"}
        left |= {target.pid for target in _not_acted_on(verdicts, results)}
        for record_path in _settled_records(verdicts, left):
            registry.remove(record_path)
    return results


def _latest_endings(
    registry: Registry | None, boot_id: str
) -> dict[ProcessIdentity, endings.Ending]:
    if registry is None:
        return {}
    return endings.latest(endings.read(registry.path / endings.ENDINGS_NAME, boot_id))


def _settled_records(verdicts: Sequence[Verdict], left: Collection[int]) -> set[Path]:
    """Records nothing more can come of: the runner is gone and every leftover of its
    group went too. A runner killed now keeps its record until a pass finds it gone,
    so that its group is judged; one without a group of its own needs no such pass."""
    settled: set[Path] = set()
    kept: set[Path] = set()
    for verdict in verdicts:
        if verdict.record is None:
            continue
        record = verdict.record.record
        killed_alone = verdict.rule == "registry" and record.pgid != record.pid
        if verdict.action == "forget" or (killed_alone and verdict.pid not in left):
            settled.add(verdict.record.path)
        elif verdict.rule == "registry-group" and verdict.pid in left:
            kept.add(verdict.record.path)
    return settled - kept
