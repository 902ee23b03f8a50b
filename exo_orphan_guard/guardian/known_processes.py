"""What the guardian's scans learned about each process, and what the next scan must
read: pure, so that every rule is tested on made-up listings.

A full scan reads every process's command line to find the spawn children: 2,000
reads every 2 s to learn that nothing changed. The guardian's scan instead keeps, per
pid, what it read and the stamp its listing gave the process then (`Stamp`: new for
each process that holds the pid), and reads a command line again only for:

- a pid it has not seen, or whose stamp changed (the pid changed hands);
- a pid read once so far: two reads a scan apart that agree settle it (a child seen
  between its fork and its exec shows its parent's command line);
- every candidate and every process whose command line vanished (a handful, which
  the scan then describes anyway), so that their reads are always fresh;
- a turn of the settled rest (`VERIFY_SCANS`): a process that execs into a runner
  later than a scan after it was first seen is read within that many scans.

The candidates it hands to the sweep's snapshot (`process_table.gather`) are then
those a full scan's command-line pass would find, and the judging is the same.

It lists processes only when the pid allocator moved (`listing_plan`): nothing
created since the last scan needs no listing, a few pids handed out are looked at
alone, and a whole listing comes at least every `FULL_LISTING_SCANS` scans (the
bound for an allocator set back by root). Each candidate's stamp is checked at every
scan all the same (`looked_at`): whether they are still the same processes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, final

from ..sweeper.process_table import is_spawn_candidate
from ..system.process_facts import CreationMark, Pid, Stamp

VERIFY_SCANS: Final = 300
"""Each settled process's command line is read again at least once in this many
scans (10 minutes at the default interval). A runner is exec'd as it is forked
(multiprocessing's spawn), so this bounds only the odd process that execs into one
later; at 2,000 processes a turn is 7 reads a scan (13 at 150)."""
FULL_LISTING_SCANS: Final = 120
"""A whole listing at least this often (4 minutes at the default interval): the bound
for a pid handed out where the allocator's mark does not show it (root set it back).
A whole listing of 2,000 processes costs about 7 ms of CPU (docs/benchmarks.md): 3.5
ms a minute at 60."""
PROBE_LIMIT: Final = 64
"""More new pids than this are listed whole: looking at each alone costs more."""
RESERVED_PIDS: Final = 300
"""Linux hands out no pid below this once it has wrapped (`RESERVED_PIDS`)."""

_UNSEEN: Final = -1
"""No stamp is negative."""

Kind = Literal["candidate", "vanished", "other"]
ListingChoice = Literal["none", "whole"] | range
"""No listing, a whole one, or a look at these pids alone."""


def kind_of(command_line: bytes | None) -> Kind:
    """`system.command_line`'s answer, as a full scan's command-line pass takes it."""
    if command_line is None:
        return "other"
    if not command_line:
        return "vanished"
    return "candidate" if is_spawn_candidate(command_line) else "other"


@final
@dataclass(frozen=True, slots=True)
class Listing:
    found: Mapping[Pid, Stamp | None]
    covered: Collection[int] | None = None
    """The pids looked at; None: all of them."""


@final
@dataclass(frozen=True, slots=True)
class Known:
    stamps: Mapping[Pid, Stamp | None] = field(default_factory=dict[Pid, "Stamp | None"])
    """Every pid read, under the stamp it had when read (None: no stamp to trust)."""
    unsettled: frozenset[Pid] = frozenset()
    """Read again at the next scan."""
    candidates: frozenset[Pid] = frozenset()
    order: tuple[Pid, ...] = ()
    """`stamps`' pids in order, for the turn of re-reads."""
    verified_to: int = 0
    """The last pid of the last turn."""
    mark: CreationMark | None = None
    """The allocator when the last scan began."""
    scans_since_whole: int = 0


@final
@dataclass(frozen=True, slots=True)
class Reads:
    pids: frozenset[Pid]
    """Whose command lines this scan reads."""
    fresh: frozenset[Pid]
    """Listed pids new, or with a new stamp."""
    forgotten: frozenset[Pid]
    """Known pids the listing no longer shows."""
    verified_to: int


def listing_plan(
    before: CreationMark | None, now: CreationMark | None, scans_since_whole: int
) -> ListingChoice:
    """What this scan lists, from the allocator at the last scan's start and now.

    Pids handed out and given back by a fork that failed (a cgroup's pids limit) are
    not counted in `forks`: a storm of those could take the allocator round unseen,
    and a new process then waits for the next whole listing, as it does after root
    set the allocator back."""
    if before is None or now is None or scans_since_whole + 1 >= FULL_LISTING_SCANS:
        return "whole"
    created = now.forks - before.forks
    alive = max(before.tasks, now.tasks)
    if created < 0 or now.pid_max != before.pid_max:
        return "whole"
    if created + alive >= now.pid_max - RESERVED_PIDS:
        return "whole"  # enough to have gone round and landed anywhere
    if now.last_pid == before.last_pid:
        return "none"  # nothing handed out here (what was created is elsewhere)
    if created == 0 or now.last_pid < before.last_pid:
        return "whole"  # set back, or wrapped: low pids were handed out then
    handed_out = range(before.last_pid + 1, now.last_pid + 1)
    return handed_out if len(handed_out) <= PROBE_LIMIT else "whole"


def looked_at(
    choice: ListingChoice, known: Known, candidate_stamps: Mapping[Pid, Stamp | None]
) -> frozenset[int] | None:
    """The pids a scan looks at alone (None: a whole listing): `listing_plan`'s, and
    each last candidate whose stamp (`system.stamp_of`, one stat) is not the one it
    was read under. After root set the allocator back, a candidate's pid may have
    gone to another runner unseen by the allocator's mark: only its stamp tells, and
    a kept judgement (`nothing_new`) rests on each candidate being the same process."""
    if choice == "whole":
        return None
    moved = frozenset(
        pid
        for pid in known.candidates
        if candidate_stamps.get(pid) is None or candidate_stamps[pid] != known.stamps.get(pid)
    )
    return moved if choice == "none" else moved.union(choice)


def plan_reads(known: Known, listing: Listing | None) -> Reads:
    """Which command lines to read: see the module's docstring."""
    fresh: frozenset[Pid] = frozenset()
    forgotten: frozenset[Pid] = frozenset()
    if listing is not None:
        stamps = known.stamps
        fresh = frozenset(
            pid for pid, stamp in listing.found.items() if stamps.get(pid, _UNSEEN) != stamp
        )
        looked_at = (
            set(known.stamps)
            if listing.covered is None
            else {Pid(pid) for pid in listing.covered if pid in known.stamps}
        )
        forgotten = frozenset(looked_at - listing.found.keys())
    turn, verified_to = _turn(known)
    pids = (fresh | known.unsettled | turn) - forgotten
    return Reads(frozenset(pids), fresh, forgotten, verified_to)


def _turn(known: Known) -> tuple[set[Pid], int]:
    """The next share of `known.order` after `known.verified_to`, wrapping round."""
    order = known.order
    if not order:
        return set(), 0
    share = math.ceil(len(order) / VERIFY_SCANS)
    start = bisect.bisect_right(order, known.verified_to)
    chosen = order[start : start + share]
    if len(chosen) < share:
        chosen += order[: share - len(chosen)]
    return set(chosen), chosen[-1]


def absorb(
    known: Known,
    mark: CreationMark | None,
    listing: Listing | None,
    reads: Reads,
    kinds: Mapping[Pid, Kind],
) -> Known:
    """What is known after this scan: `kinds` holds what each of `reads.pids` read."""
    stamps = known.stamps
    if listing is not None and (reads.fresh or reads.forgotten):
        # Copied only then: most scans change nothing (2,000 entries a scan add up).
        changed = dict(known.stamps)
        for pid in reads.forgotten:
            del changed[pid]
        changed.update({pid: listing.found[pid] for pid in reads.fresh})
        stamps = changed
    unsettled: set[Pid] = set()
    candidates: set[Pid] = set()
    for pid, kind in kinds.items():
        stamp = stamps.get(pid)
        if kind != "other":
            candidates.add(pid)
            unsettled.add(pid)
        elif not _settles(known, pid, stamp):
            unsettled.add(pid)
    order = known.order
    if stamps is not known.stamps and stamps.keys() != known.stamps.keys():
        order = tuple(sorted(stamps))
    whole = listing is not None and listing.covered is None
    return Known(
        stamps=stamps,
        unsettled=frozenset(unsettled),
        candidates=frozenset(candidates),
        order=order,
        verified_to=reads.verified_to,
        mark=mark,
        scans_since_whole=0 if whole else known.scans_since_whole + 1,
    )


def nothing_new(before: Known, now: Known, listing: Listing | None, reads: Reads) -> bool:
    """Whether a scan found the candidates the scan before found, each still the same
    process: no pid was handed out since (`listing` None), or the listing shows each
    candidate it covers under the stamp it had. A listing without stamps (psutil's)
    cannot tell, nor can the first scan."""
    if not before.stamps or now.candidates != before.candidates:
        return False
    if listing is None:
        return True
    covered = listing.covered
    return all(
        pid not in reads.fresh and listing.found.get(pid) is not None
        for pid in before.candidates
        if covered is None or pid in covered
    )


def _settles(known: Known, pid: Pid, stamp: Stamp | None) -> bool:
    """A read of "other" settles `pid` if an earlier scan read the same under the same
    stamp; with no stamp, nothing tells that it is still the same process."""
    return (
        stamp is not None
        and pid in known.stamps
        and known.stamps[pid] == stamp
        and pid not in known.candidates
    )
