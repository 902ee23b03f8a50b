"""What a sweep judges by: its options, checked; the records and the process table
it reads; the verdicts `verdicts.decide` gives them. Nothing here acts."""

from __future__ import annotations

import os
import re
from collections.abc import Collection

from ..records import sightings
from ..records.registry import LoadedRecord, Registry
from ..system.identity import liveness
from . import process_table
from .process_memo import ProcessMemo
from .process_table import ProcessTable
from .verdicts import SweepOptions, Verdict, decide


def sweep_options(
    fingerprint: bool, match: str | re.Pattern[str] | None, any_parent: bool, all_users: bool
) -> SweepOptions:
    """What to judge by, checked: ValueError says what is wrong, in the CLI's words."""
    if any_parent and match is None:
        raise ValueError("--any-parent needs --match: it never applies to exo's own runners")
    if all_users and os.geteuid() != 0:
        raise ValueError("--all-users needs root: only root may signal other users' processes")
    if isinstance(match, str):
        try:
            match = re.compile(match)
        except re.error as error:
            raise ValueError(
                f"--match {match!r} is not a valid regular expression: {error}"
            ) from error
    return SweepOptions(
        fingerprint=fingerprint, match=match, any_parent=any_parent, all_users=all_users
    )


def judge(
    registry: Registry | None,
    options: SweepOptions,
    warnings: list[str],
    candidates: Collection[int] | None = None,
    memo: ProcessMemo | None = None,
    seen_by: sightings.Reader | None = None,
) -> tuple[ProcessTable, tuple[Verdict, ...]]:
    """Read the records (their problems into `warnings`), snapshot what they and
    `options` call for (`candidates`, `memo`: see `process_table.gather`), and judge each
    process (`verdicts.decide`) by them and by what the guardian saw (`sightings`, read
    through `seen_by` if given)."""
    records: list[LoadedRecord] = []
    if registry is not None:
        records, problems = registry.load()
        warnings.extend(problems)
    interesting = {
        pid for loaded in records for pid in (loaded.record.pid, loaded.record.worker.pid)
    }
    # Only the group of a runner that is gone (or whose worker is, so that the runner
    # may go any moment) can hold leftovers to judge; scanning for group members reads
    # every process, so it is done only then.
    groups = {
        loaded.record.pgid
        for loaded in records
        if loaded.record.pgid is not None
        and (
            liveness(loaded.record.identity) == "gone" or liveness(loaded.record.worker) != "alive"
        )
    }
    table = process_table.gather(
        interesting,
        fingerprint=options.fingerprint,
        match=options.match,
        groups=groups,
        candidates=candidates,
        memo=memo,
    )
    read = sightings.read if seen_by is None else seen_by.read
    seen = {} if registry is None else read(registry.path, table.boot_id)
    return table, decide(table, records, options, seen)
