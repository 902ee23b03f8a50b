"""The guardian's scan of the process table: the reads that `known_processes` plans.

Each scan reads the pid allocator's mark, lists what the plan says (nothing, a few
pids, or every process), reads the command lines it names, and hands the candidates
(spawn children, and processes whose command line vanished) to the sweep's snapshot
in place of a pass over every command line (`judging.judge`'s `candidates`), with
what the scans before read of them that cannot have changed (`memo`:
`sweeper.process_memo`), and the guardian's sightings, parsed again only when the file
changed (`seen`).
"""

from __future__ import annotations

from typing import final

from .. import system
from ..records import sightings
from ..sweeper.process_memo import ProcessMemo
from ..system.process_facts import Pid
from .known_processes import (
    Kind,
    Known,
    Listing,
    absorb,
    kind_of,
    listing_plan,
    looked_at,
    nothing_new,
    plan_reads,
)


@final
class CheapScan:
    def __init__(self) -> None:
        self._known = Known()
        self.memo = ProcessMemo()
        self.seen = sightings.Reader()
        """For `judge`, with the candidates."""
        self.unchanged = False
        """Whether the last scan found what the one before it did: the same candidates,
        and none of them a process new since (`known_processes.nothing_new`)."""

    def candidates(self) -> frozenset[Pid]:
        """The pids whose command lines a full scan's pass would pick now."""
        known = self._known
        mark = system.creation_mark()
        choice = listing_plan(known.mark, mark, known.scans_since_whole)
        stamps = {} if choice == "whole" else {p: system.stamp_of(p) for p in known.candidates}
        pids = looked_at(choice, known, stamps)
        listing: Listing | None = None
        if pids is None:
            listing = Listing(system.list_processes())
        elif pids:
            listing = Listing(system.processes_among(pids), pids)
        reads = plan_reads(known, listing)
        kinds: dict[Pid, Kind] = {pid: kind_of(system.command_line(pid)) for pid in reads.pids}
        self._known = absorb(known, mark, listing, reads, kinds)
        self.unchanged = nothing_new(known, self._known, listing, reads)
        return self._known.candidates
