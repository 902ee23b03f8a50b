"""When a scan may keep the last scan's judgement instead of judging again: decided
by a pure function (`still_stands`), so that every condition is tested on made-up
scans.

An idle exo, watched, is the guardian's usual day: each scan described the exo and its
runners again (their stat files, command lines and executables, `process_memo`) and
judged them again, to find what it found the scan before. It cannot find anything
else while all of these hold:

- nothing new was listed (`known_processes.nothing_new`): the same candidates, each
  still the same process (its stamp in the listing unchanged, or no pid handed out);
- the same pids are named to be watched (exo's pidfile, watch requests, `--watch`);
- every candidate is a runner the last judgement saw under an exo that is still
  watched, with its exit watch in place: such a runner is orphaned only when that exo
  dies, and its exit watch says so at once (a death changes what is watched, and the
  scan after it judges again);
- the last judgement ended nothing and saw no young orphan that may yet show it is
  exo (`leaving.starting`);
- the registry holds no runner record, and its directories are as they were (`Place`),
  having been so for longer than a write could leave unseen (`SETTLED_SECONDS`): a
  recorded runner may be any process, and its worker's death shows only in a
  judgement, as does a record written since.

Each candidate's stamp is looked at every scan, so a pid handed out again after root
set the allocator back shows at once. macOS lists every process at each scan, stamped
by start time; the portable backend's listing has no stamps, so there every scan
judges. An ending never uses a kept judgement: it judges afresh before any signal.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final

from ..sweeper.process_table import ProcessInfo, ProcessTable, gather
from ..sweeper.verdicts import Verdict
from ..system.identity import ProcessIdentity
from ..system.process_facts import Pid
from .watchlist import Watched

SETTLED_SECONDS: Final = 2.0
"""A write into a directory sets its mtime from a coarse clock: a tick (1-10 ms on
Linux), or the filesystem's granule (FAT's 2 s). A write after a look, within the
granule of the mtime the look saw, leaves the directory as seen; once its mtime is
this much older than the look, any later write changes it."""


@final
@dataclass(frozen=True, slots=True)
class Place:
    """Device, inode and modification time (ns) of each registry directory, None where
    there is none: a record written, removed or renamed into one changes it."""

    directories: tuple[tuple[int, int, int] | None, ...]
    looked_ns: int = field(compare=False)
    """The wall clock when they were looked at."""

    @property
    def settled(self) -> bool:
        """Whether a write since the look must show (`SETTLED_SECONDS`)."""
        margin = SETTLED_SECONDS * 1e9
        return all(d is None or self.looked_ns - d[2] >= margin for d in self.directories)


@final
@dataclass(frozen=True, slots=True)
class Judgement:
    """What a scan judged, and from what."""

    table: ProcessTable
    verdicts: Sequence[Verdict]
    named: Sequence[ProcessInfo]
    """The processes named to be watched, as described then."""
    found: Watched
    """The exo processes found, with their runners."""
    candidates: frozenset[Pid]
    named_pids: tuple[int, ...]
    starting: bool
    """A young orphan not known to be exo was seen."""
    registry: tuple[Path, ...]
    """The registry's directories that were looked at."""
    place: Place
    """`registry` as it was (`place_of`)."""


def still_stands(
    last: Judgement,
    candidates: frozenset[Pid],
    unchanged: bool,
    named_pids: tuple[int, ...],
    watched: Collection[ProcessIdentity],
    exit_watched: Collection[ProcessIdentity],
    place: Place,
) -> bool:
    """Whether judging now would find what `last` found (see the module's docstring);
    `place`: `last.registry` as it is now."""
    if not unchanged or candidates != last.candidates or named_pids != last.named_pids:
        return False
    if last.starting or not last.place.settled or place != last.place:
        return False
    if any(verdict.action == "kill" or verdict.record is not None for verdict in last.verdicts):
        return False
    exo_processes = set(last.found)
    if set(watched) != exo_processes or not exo_processes <= set(exit_watched):
        return False
    runners = {runner.pid for runners in last.found.values() for runner in runners}
    return candidates <= runners


def named_processes(table: ProcessTable, pids: Sequence[int]) -> list[ProcessInfo]:
    """The processes named to be watched (by exo's pidfile, by `--watch`) that are
    alive: from `table`, or read now."""
    unlisted = [pid for pid in pids if Pid(pid) not in table.processes]
    read: Mapping[Pid, ProcessInfo] = (
        gather(unlisted, fingerprint=False, match=None).processes if unlisted else {}
    )
    found = [table.processes.get(Pid(pid)) or read.get(Pid(pid)) for pid in pids]
    return [info for info in found if info is not None]


def place_of(directories: Sequence[Path]) -> Place:
    """Each directory's device, inode and modification time; None where there is none."""
    place: list[tuple[int, int, int] | None] = []
    looked_ns = time.time_ns()
    for directory in directories:
        try:
            info = os.stat(directory)
        except OSError:
            place.append(None)
        else:
            place.append((info.st_dev, info.st_ino, info.st_mtime_ns))
    return Place(tuple(place), looked_ns)
