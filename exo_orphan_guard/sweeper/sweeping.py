"""`sweep()`: find runners that outlived their worker and end them, under the
registry's lock; what the CLI's `sweep` and `scan` and exo's worker hook run.

Under the lock, a sweep continues what a dead sweeper left stopped, judges
(`judging.judge`), plans each target's ending (`sweep_endings.plan`), ends them
(`engine.end`), writes down how (`sweep_endings.Ledger`), and deletes the records
nothing more can come of. `sweep_async()` runs the same in a worker thread for an
event loop, and stops it (`stop`) when the task awaiting it is cancelled.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, ParamSpec, final

from ..records import endings
from ..records.freeze_journal import FreezeJournal, thaw_abandoned
from ..records.registry import LockUnavailableError, Registry
from ..system import settings
from ..system.identity import ProcessIdentity, current_identity
from ..system.process_facts import Pid
from . import engine, family
from .engine import KillResult
from .judging import judge, sweep_options
from .sweep_endings import Bounds, Ledger, plan
from .sweep_report import SweepReport
from .verdicts import SweepOptions, Verdict

P = ParamSpec("P")

DEFAULT_KILL_WAIT_SECONDS: Final = 2.0
DEFAULT_LOCK_TIMEOUT_SECONDS: Final = 15.0
_PASSES: Final = 2


@final
@dataclass(frozen=True, slots=True)
class _Sweep:
    """One sweep's checked arguments, the same for each registry directory."""

    options: SweepOptions
    bounds: Bounds
    dry_run: bool
    lock_timeout: float
    wait_for_endings: bool
    on_wait: Callable[[str], None] | None
    stop: threading.Event | None


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
) -> SweepReport:
    """End runners whose worker is dead; spare everything else.

    Targets: recorded runners whose recorded worker is gone, and what they provably
    started; with `fingerprint`, exo spawn children whose spawner is gone; with
    `match`, processes whose command line matches and that were reparented (or, with
    `any_parent`, any). Never: this process, its ancestors and descendants, another
    exo-orphan-guard process, other users' processes (unless `all_users`, root only),
    a process whose start time or command line differs from its record, a process it
    cannot read.

    An exo runner gets SIGINT on its main thread (KeyboardInterrupt unwinds it through
    Python), then the busy wait (EXO_ORPHAN_GUARD_BUSY_WAIT, never less than the
    grace; with `wait_for_endings=False`, the grace) before SIGKILL; everything else
    gets SIGTERM, then `grace` (default EXO_ORPHAN_GUARD_GRACE, else 10 s). A runner
    already ending the clean way, or that another sweeper has begun to end, is first
    left alone until its deadline (`wait_for_endings=False`: not at all); `on_wait`
    gets one line for each such wait, saying which, why and until when. `stop`, set
    from another thread, ends every wait: for the lock (nothing done), for a runner
    ending by itself (left as it is, in `left_to_end`).
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
    busy = settings.busy_wait_setting()
    if busy.warning is not None:
        warnings.append(busy.warning)
    interrupt_wait = settings.interrupt_bound(busy.value, grace) if wait_for_endings else grace
    asked = _Sweep(
        options,
        Bounds(grace, interrupt_wait, kill_wait),
        dry_run,
        lock_timeout,
        wait_for_endings,
        on_wait,
        stop,
    )
    if registry_dir is not None:
        return _sweep_directory(asked, registry_dir, warnings, started)
    # Also the registry from before EXO_HOME counted, while it holds anything.
    current, *former = settings.registry_dirs()
    report = _sweep_directory(asked, current, warnings, started)
    for path in former:
        if path.is_dir():
            report = report.merged(_sweep_directory(asked, path, [], time.monotonic()))
    return report


def _sweep_directory(asked: _Sweep, path: Path, warnings: list[str], started: float) -> SweepReport:
    registry, problem = Registry.open(path, create=not asked.dry_run)
    if problem is not None:
        warnings.append(problem)

    def report(outcome: _Outcome, locked: bool = True) -> SweepReport:
        return SweepReport(
            verdicts=outcome.verdicts,
            results=outcome.results,
            warnings=tuple(warnings),
            dry_run=asked.dry_run,
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

    if asked.dry_run:
        table, verdicts = judge(registry, asked.options, warnings)
        targets = _targets(verdicts)
        directory = None if registry is None else registry.path
        latest = Ledger(directory, table.boot_id, "sweep", verdicts).latest()
        return report(
            _Outcome(
                verdicts,
                (),
                would_signal=family.preview(targets, table.protected),
                target_endings={t: latest[t] for t in targets if t in latest},
            )
        )
    if registry is None:
        return report(_end_orphans(asked, None, warnings))
    try:
        with registry.locked(asked.lock_timeout, asked.stop) as acquired:
            if not acquired:
                return report(_Outcome((), ()), locked=False)
            registry.remove_stale_temporaries(time.time())
            return report(_end_orphans(asked, registry, warnings))
    except LockUnavailableError as error:
        warnings.append(f"{error.strerror}: sweeping without it")
    return report(_end_orphans(asked, registry, warnings))


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


def _end_orphans(asked: _Sweep, registry: Registry | None, warnings: list[str]) -> _Outcome:
    """Judge and end; once more if a recorded runner that led its own process group
    went meanwhile, so that what it left in its group is judged on the same records
    (a runner can die between the snapshot and the kill, its children reparented
    out of reach of the tree walk)."""
    continued: list[ProcessIdentity] = []
    journal: FreezeJournal | None = None
    if registry is not None:
        continued = thaw_abandoned(registry.path)
        journal = FreezeJournal.create(registry.path, current_identity())
    verdicts: list[Verdict] = []
    results: list[KillResult] = []
    left_to_end: list[ProcessIdentity] = []
    try:
        for _ in range(_PASSES):
            table, judged = judge(registry, asked.options, warnings)
            directory = None if registry is None else registry.path
            ledger = Ledger(directory, table.boot_id, "sweep", judged, asked.on_wait)
            latest = ledger.latest()
            targets = plan(
                judged,
                latest,
                ledger.began,
                asked.bounds,
                wait_for_endings=asked.wait_for_endings,
            )
            ledger.leaving_alone(targets, latest)
            ended = engine.end(
                targets,
                table.protected,
                kill_wait=asked.bounds.kill_wait,
                journal=journal,
                renew=ledger.renew,
                stop=asked.stop,
                on_signal=ledger.begun,
            )
            acted = ledger.ended(ended)
            if registry is not None:
                _settle(registry, judged, acted, table.boot_id)
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


def _settle(
    registry: Registry,
    verdicts: Sequence[Verdict],
    results: Sequence[KillResult],
    boot_id: str,
) -> None:
    endings.compact(registry.path / endings.ENDINGS_NAME, boot_id)
    left = {result.target.pid for result in results if result.outcome == "unkillable"}
    left |= {target.pid for target in _not_acted_on(verdicts, results)}
    for record_path in _settled_records(verdicts, left):
        registry.remove(record_path)


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
told to stop, waits no more: a runner it was waiting for it leaves as it is, the lock
it was waiting for it gives up. An ending under way (the first signal, its wait,
SIGKILL) it finishes in the background."""


def _targets(verdicts: Sequence[Verdict]) -> list[ProcessIdentity]:
    return [
        verdict.process.identity
        for verdict in verdicts
        if verdict.action == "kill" and verdict.process is not None
    ]


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
