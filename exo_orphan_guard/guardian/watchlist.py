"""Which exo processes the guardian watches, decided from a sweep's snapshot and
verdicts: pure, so that every rule is tested on made-up tables.

An exo process is a live process of this user that shows it runs exo
(`ProcessInfo.exo_evidence`: exo's Rust extension mapped, the frozen app, exo's own
command line; `sweeper.exo_detect`) and is the parent of spawn children that no rule
marks for ending: its runners. exo's resource tracker and `macmon` run without
`--multiprocessing-fork`, so they are never runners. exo's pidfile (exo main) names
the process even before it has runners. What is watched is also what the guardian
remembers (`records.sightings`): the runners seen under a live exo are known to be
exo's once it is gone, whatever they show themselves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final, final

from ..records import sightings
from ..sweeper.process_table import ProcessInfo, ProcessTable
from ..sweeper.verdicts import Verdict
from ..system.identity import ProcessIdentity, liveness
from ..system.process_facts import Pid

Watched = Mapping[ProcessIdentity, frozenset[ProcessIdentity]]
"""Each exo process watched, and the runners last seen under it."""
_NO_RUNNERS: Final[frozenset[ProcessIdentity]] = frozenset()


def exo_processes(
    table: ProcessTable, verdicts: Sequence[Verdict], named: Iterable[ProcessInfo] = ()
) -> dict[ProcessIdentity, frozenset[ProcessIdentity]]:
    """Live exo processes of the table's user with their runners; `named`: processes
    exo's pidfile names, watched with whatever runners they have (none yet, maybe).
    Never the guardian's own family, pid 1, or a process a verdict would end."""
    ending = {verdict.pid for verdict in verdicts if verdict.action == "kill"}
    found: dict[ProcessIdentity, set[ProcessIdentity]] = {}
    for info in table.processes.values():
        if not _may_watch(info, table) or not info.is_spawn_child or info.pid in ending:
            continue
        parent = table.processes.get(Pid(info.ppid))
        if parent is None or not parent.runs_exo:
            continue
        if not _may_watch(parent, table) or parent.pid in ending:
            continue
        found.setdefault(parent.identity, set()).add(info.identity)
    for info in named:
        if _may_watch(info, table) and info.pid not in ending:
            found.setdefault(info.identity, set())
    return {process: frozenset(runners) for process, runners in found.items()}


def _may_watch(info: ProcessInfo, table: ProcessTable) -> bool:
    return (
        info.pid > 1
        and not info.exited
        and not info.vanished
        and info.uid == table.uid
        and info.pid not in table.protected
        and not info.is_guard
    )


def remember(directory: Path, table: ProcessTable, watched: Watched) -> str | None:
    """Keep what is `watched` in the sightings of the registry's host `directory`
    (`records.sightings`), beside what was seen before of runners still alive: once
    their exo is gone, they are known to be its runners, to this guardian, to its
    successor after a SIGKILL, and to a sweep. Call it before an exit watch starts on
    any of them. A warning if they could not be written (their endings then rest on
    what each runner shows itself)."""
    return sightings.remember(
        directory, table.boot_id, watched, lambda runner: liveness(runner) != "gone"
    )


Signature = tuple[int, int, int, int]


@final
class Remembering:
    """`remember`, left out while what is watched and the sightings file are as the
    last call left them: an idle exo's scans read, merged and compared the file at
    every scan to write nothing. What it saves: dropping, from a sighting of an exo no
    longer watched, runners that died since (a sighting names processes by identity,
    so one of a dead process never counts for another); that waits for the next
    change of what is watched."""

    def __init__(self) -> None:
        self._left: tuple[Path, Watched, Signature] | None = None

    def remember(self, directory: Path, table: ProcessTable, watched: Watched) -> str | None:
        path = directory / sightings.SIGHTINGS_NAME
        signature = _signature(path)
        if signature is not None and self._left == (directory, watched, signature):
            return None
        problem = remember(directory, table, watched)
        signature = _signature(path)
        self._left = None
        if problem is None and signature is not None:
            self._left = (directory, dict(watched), signature)
        return problem


def _signature(path: Path) -> Signature | None:
    """What changes whenever the file is replaced, written or removed."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns


def newly_watched(before: Watched, now: Watched) -> list[ProcessIdentity]:
    """exo processes in `now` that `before` did not watch: each needs an exit watch."""
    return [process for process in now if process not in before]


def runners_of(watched: Watched, process: ProcessIdentity) -> frozenset[ProcessIdentity]:
    return watched.get(process, _NO_RUNNERS)
