"""The startup sweep: find runners that outlived their worker and kill them.

`sweep()` locks the registry, reads it, snapshots the process table, lets
`verdicts.decide` judge, then acts: kills targets (`killing`), deletes stale records.
`sweep_async()` runs the same in a worker thread for exo's event loop.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, ParamSpec, TypeVar, final

from . import killing, process_table, settings
from .identity import liveness
from .killing import KillResult
from .process_table import ProcessTable
from .registry import LoadedRecord, LockUnavailableError, Registry
from .verdicts import SweepOptions, Verdict, decide

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_KILL_WAIT_SECONDS: Final = 2.0
DEFAULT_LOCK_TIMEOUT_SECONDS: Final = 15.0


@final
@dataclass(frozen=True, slots=True)
class SweepReport:
    verdicts: tuple[Verdict, ...]
    results: tuple[KillResult, ...]
    warnings: tuple[str, ...]
    dry_run: bool
    registry: Path | None
    elapsed_seconds: float
    lock_acquired: bool = True

    @property
    def targets(self) -> tuple[Verdict, ...]:
        return tuple(verdict for verdict in self.verdicts if verdict.action == "kill")

    @property
    def survivors(self) -> tuple[KillResult, ...]:
        return tuple(result for result in self.results if result.outcome == "unkillable")

    @property
    def exit_code(self) -> int:
        """0 nothing left; 1 orphans remain (or would, for a dry run)."""
        if self.dry_run:
            return 1 if self.targets else 0
        return 1 if self.survivors or not self.lock_acquired else 0

    def summary(self) -> str:
        if not self.lock_acquired:
            return "another sweep held the registry lock: nothing done"
        if self.dry_run:
            return f"{len(self.targets)} orphan(s) found, nothing killed (dry run)"
        killed = sum(result.outcome != "unkillable" for result in self.results)
        return (
            f"{len(self.targets)} orphan(s) found, {killed} gone, {len(self.survivors)} unkillable"
        )


def sweep(
    *,
    dry_run: bool = False,
    registry_dir: Path | None = None,
    grace: float | None = None,
    kill_wait: float = DEFAULT_KILL_WAIT_SECONDS,
    fingerprint: bool = True,
    match: str | re.Pattern[str] | None = None,
    any_parent: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
) -> SweepReport:
    """Kill runners whose worker is dead; spare everything else.

    Targets: recorded runners whose recorded worker is gone; with `fingerprint`, exo
    spawn children whose parent is not a live exo process; with `match`, processes
    whose command line matches and that were reparented (or, with `any_parent`, any).
    Never: this process, its ancestors and descendants, other users' processes, a
    process whose start time or command line differs from its record.

    `grace` (default EXO_ORPHAN_GUARD_GRACE, else 2 s) separates SIGTERM from SIGKILL.
    Raises ValueError for a bad `match` or `any_parent` without `match`; everything
    else wrong (unreadable registry, corrupt records, racing processes) becomes a
    warning in the report.
    """
    started = time.monotonic()
    options = _options(fingerprint, match, any_parent)
    warnings: list[str] = []
    if grace is None:
        parsed = settings.parse_grace(os.environ.get(settings.GRACE_ENV))
        grace = parsed.value
        if parsed.warning is not None:
            warnings.append(parsed.warning)
    path = registry_dir if registry_dir is not None else settings.registry_dir()
    registry, problem = Registry.open(path, create=False)
    if problem is not None:
        warnings.append(problem)

    def report(
        verdicts: Sequence[Verdict], results: Sequence[KillResult], locked: bool = True
    ) -> SweepReport:
        return SweepReport(
            verdicts=tuple(verdicts),
            results=tuple(results),
            warnings=tuple(warnings),
            dry_run=dry_run,
            registry=None if registry is None else registry.path,
            elapsed_seconds=time.monotonic() - started,
            lock_acquired=locked,
        )

    if registry is None or dry_run:
        table, verdicts = judge(registry, options, warnings)
        results = [] if dry_run else _act(registry, table, verdicts, grace, kill_wait)
        return report(verdicts, results)
    try:
        with registry.locked(lock_timeout) as acquired:
            if not acquired:
                return report([], [], locked=False)
            registry.remove_stale_temporaries(time.time())
            table, verdicts = judge(registry, options, warnings)
            return report(verdicts, _act(registry, table, verdicts, grace, kill_wait))
    except LockUnavailableError as error:
        warnings.append(f"{error.strerror}: sweeping without it")
    table, verdicts = judge(registry, options, warnings)
    return report(verdicts, _act(registry, table, verdicts, grace, kill_wait))


def _in_worker_thread(function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        import anyio.to_thread  # only exo's event loop needs it: the CLI starts without

        return await anyio.to_thread.run_sync(functools.partial(function, *args, **kwargs))

    return run


sweep_async = _in_worker_thread(sweep)
"""`sweep()` in a worker thread, so exo's event loop keeps running meanwhile."""


def _options(
    fingerprint: bool, match: str | re.Pattern[str] | None, any_parent: bool
) -> SweepOptions:
    if any_parent and match is None:
        raise ValueError("--any-parent needs --match: it never applies to exo's own runners")
    if isinstance(match, str):
        try:
            match = re.compile(match)
        except re.error as error:
            raise ValueError(
                f"--match {match!r} is not a valid regular expression: {error}"
            ) from error
    return SweepOptions(fingerprint=fingerprint, match=match, any_parent=any_parent)


def judge(
    registry: Registry | None, options: SweepOptions, warnings: list[str]
) -> tuple[ProcessTable, tuple[Verdict, ...]]:
    records: list[LoadedRecord] = []
    if registry is not None:
        records, problems = registry.load()
        warnings.extend(problems)
    interesting = {
        pid for loaded in records for pid in (loaded.record.pid, loaded.record.worker.pid)
    }
    # Only the group of a runner that is gone can hold leftovers; scanning for group
    # members reads every process, so it is done only then.
    groups = {
        loaded.record.pgid
        for loaded in records
        if loaded.record.pgid is not None and liveness(loaded.record.identity) == "gone"
    }
    table = process_table.gather(
        interesting, fingerprint=options.fingerprint, match=options.match, groups=groups
    )
    return table, decide(table, records, options)


def _act(
    registry: Registry | None,
    table: ProcessTable,
    verdicts: Sequence[Verdict],
    grace: float,
    kill_wait: float,
) -> list[KillResult]:
    targets = [
        verdict.process.identity
        for verdict in verdicts
        if verdict.action == "kill" and verdict.process is not None
    ]
    results = killing.execute(targets, table.uid, table.protected, grace, kill_wait)
    if registry is not None:
        gone = {result.target.pid for result in results if result.outcome != "unkillable"}
        for verdict in verdicts:
            if verdict.record is not None and (verdict.action == "forget" or verdict.pid in gone):
                registry.remove(verdict.record.path)
    return results
