"""What the guardian's scan reads, and lists, on made-up listings and allocator marks
(`guardian.known_processes`: pure). Against real process tables: test_cheap_scan."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import pytest

from exo_orphan_guard.guardian.known_processes import (
    FULL_LISTING_SCANS,
    PROBE_LIMIT,
    VERIFY_SCANS,
    Kind,
    Known,
    Listing,
    ListingChoice,
    absorb,
    kind_of,
    listing_plan,
    looked_at,
    nothing_new,
    plan_reads,
)
from exo_orphan_guard.system.process_facts import CreationMark, Pid, Stamp

RUNNER = (
    b"/venv/bin/python\0-c\0from multiprocessing.spawn import spawn_main\0--multiprocessing-fork\0"
)
SHELL = b"/bin/sh\0-c\0sleep 1\0"
MARK = CreationMark(last_pid=5000, forks=90_000, tasks=400, pid_max=4_194_304)

Reader = Callable[[Pid], Kind]


def _others(_pid: Pid) -> Kind:
    return "other"


def _scan(
    known: Known,
    found: Mapping[int, Stamp | None] | None,
    read: Reader = _others,
    covered: range | None = None,
) -> tuple[Known, set[int]]:
    """One scan: what it read, and what it knows after."""
    listing = None if found is None else Listing({Pid(pid): s for pid, s in found.items()}, covered)
    reads = plan_reads(known, listing)
    kinds: dict[Pid, Kind] = {pid: read(pid) for pid in reads.pids}
    return absorb(known, MARK, listing, reads, kinds), set(reads.pids)


def _settled(found: Mapping[int, Stamp | None], read: Reader = _others) -> Known:
    known, _ = _scan(Known(), found, read)
    known, _ = _scan(known, found, read)
    return known


def test_command_lines_are_taken_as_the_full_scans_pass_takes_them() -> None:
    assert kind_of(RUNNER) == "candidate"
    assert kind_of(b"/Applications/EXO.app/Contents/Resources/exo/exo\0--multiprocessing-fork\0")
    assert kind_of(b"") == "vanished"
    assert kind_of(None) == "other"
    assert kind_of(SHELL) == "other"
    # A word that merely holds the flag is not the flag.
    assert kind_of(b"grep\0--multiprocessing-forks\0") == "other"


def test_the_first_scan_reads_everything_and_the_second_settles_it() -> None:
    found = {10: 1, 11: 2, 12: 3}
    known, read = _scan(Known(), found)
    assert read == {10, 11, 12} and known.unsettled == {10, 11, 12}
    known, read = _scan(known, found)
    assert read == {10, 11, 12} and not known.unsettled
    _, read = _scan(known, found)
    assert len(read) <= 1, "a settled table is read only in turns"


def test_a_listing_changes_only_what_is_new_or_changed_hands() -> None:
    known = _settled({10: 1, 11: 2, 12: 3})
    assert known.order == (10, 11, 12)
    known, read = _scan(known, {10: 1, 11: 7, 12: 3, 13: 4})
    # 11's stamp changed: the pid changed hands. 13 is new.
    assert {11, 13} <= read and read - {11, 13} <= {known.verified_to}, "and one in turn"
    assert known.unsettled == {11, 13}
    assert known.stamps[Pid(11)] == 7


def test_a_reused_pid_that_is_now_a_runner_is_a_candidate_at_once() -> None:
    known = _settled({10: 1, 11: 2})

    def runner_at_11(pid: Pid) -> Kind:
        return "candidate" if pid == 11 else "other"

    known, _ = _scan(known, {10: 1, 11: 9}, runner_at_11)
    assert known.candidates == {11}


def test_a_whole_listing_forgets_what_it_no_longer_shows_and_a_partial_one_only_its_own() -> None:
    known = _settled({10: 1, 11: 2, 500: 3})
    known, read = _scan(known, {10: 1, 11: 2}, covered=range(10, 12))
    assert set(known.stamps) == {10, 11, 500}, "500 was not looked at"
    known, read = _scan(known, {11: 2, 12: 4}, covered=range(10, 13))
    assert set(known.stamps) == {11, 12, 500} and 10 not in read
    known, _ = _scan(known, {11: 2, 12: 4})
    assert set(known.stamps) == {11, 12}


def test_candidates_and_vanished_command_lines_are_read_at_every_scan() -> None:
    kinds: dict[int, Kind] = {10: "other", 11: "candidate", 12: "vanished"}

    def read(pid: Pid) -> Kind:
        return kinds[pid]

    known = _settled({10: 1, 11: 2, 12: 3}, read)
    assert known.candidates == {11, 12}
    for _ in range(3):
        known, read_now = _scan(known, None, read)
        assert {11, 12} <= read_now
    # The runner exits; its pid is not listed again until a listing comes.
    kinds[11] = "other"
    known, _ = _scan(known, None, read)
    assert known.candidates == {12}


def test_a_child_seen_before_its_exec_is_read_again_at_the_next_scan() -> None:
    """Between fork and exec a spawn child shows its parent's command line."""
    known = _settled({10: 1})
    known, _ = _scan(known, {10: 1, 20: 5})  # seen as its parent
    assert known.candidates == set() and 20 in known.unsettled

    def exec_ed(pid: Pid) -> Kind:
        return "candidate" if pid == 20 else "other"

    known, read = _scan(known, None, exec_ed)
    assert 20 in read and known.candidates == {20}


def test_a_settled_process_that_execs_later_is_read_within_verify_scans() -> None:
    found = {pid: pid for pid in range(1000, 1000 + 3 * VERIFY_SCANS)}
    known = _settled(found)
    late = Pid(1000 + VERIFY_SCANS)  # anywhere in the table

    def exec_ed(pid: Pid) -> Kind:
        return "candidate" if pid == late else "other"

    scans = 0
    while late not in known.candidates:
        known, read = _scan(known, None, exec_ed)
        scans += 1
        assert len(read) <= 3 + 1, "a turn reads its share, and the candidates"
        assert scans <= VERIFY_SCANS, "the turn missed it"


def test_every_settled_pid_is_read_once_per_turn_whatever_comes_and_goes() -> None:
    found: dict[int, Stamp | None] = {pid: pid for pid in range(2, 2000, 3)}
    known = _settled(found)
    seen: set[int] = set()
    for scan in range(VERIFY_SCANS):
        # A pid comes and one goes every scan: the order is rebuilt each time.
        found[5000 + scan] = scan
        del found[min(found)]
        known, read = _scan(known, found)
        seen |= read
    assert set(found) <= seen


def test_without_stamps_every_pid_is_read_at_every_scan() -> None:
    found: dict[int, Stamp | None] = {10: None, 11: None}
    known = _settled(found)
    assert known.unsettled == {10, 11}
    _, read = _scan(known, found)
    assert read == {10, 11}


def _mark(last_pid: int, forks: int, tasks: int = 400, pid_max: int = 4_194_304) -> CreationMark:
    return CreationMark(last_pid=last_pid, forks=forks, tasks=tasks, pid_max=pid_max)


@pytest.mark.parametrize(
    ("before", "now", "scans", "choice"),
    [
        # Nothing created: nothing listed.
        (_mark(5000, 100), _mark(5000, 100), 0, "none"),
        # Created elsewhere (another pid namespace): nothing handed out here.
        (_mark(5000, 100), _mark(5000, 150), 0, "none"),
        # A few pids handed out: only they are looked at.
        (_mark(5000, 100), _mark(5003, 103), 0, range(5001, 5004)),
        (_mark(5000, 100), _mark(5000 + PROBE_LIMIT, 200), 0, range(5001, 5001 + PROBE_LIMIT)),
        # Too many to look at one by one.
        (_mark(5000, 100), _mark(5001 + PROBE_LIMIT, 300), 0, "whole"),
        # Wrapped round pid_max: low pids were handed out too.
        (_mark(32760, 100, pid_max=32768), _mark(310, 105, pid_max=32768), 0, "whole"),
        # Enough created to have gone round whole and landed anywhere.
        (_mark(5000, 100, pid_max=32768), _mark(5002, 40_000, pid_max=32768), 0, "whole"),
        # Moved with nothing created: set back (ns_last_pid).
        (_mark(5000, 100), _mark(5002, 100), 0, "whole"),
        (_mark(5000, 100), _mark(4000, 101), 0, "whole"),
        # Nothing known, nothing to read, or the counters make no sense.
        (None, _mark(5000, 100), 0, "whole"),
        (_mark(5000, 100), None, 0, "whole"),
        (_mark(5000, 100), _mark(5000, 99), 0, "whole"),
        (_mark(5000, 100, pid_max=32768), _mark(5000, 100), 0, "whole"),
        # A whole listing at least every FULL_LISTING_SCANS scans.
        (_mark(5000, 100), _mark(5000, 100), FULL_LISTING_SCANS - 1, "whole"),
        (_mark(5000, 100), _mark(5000, 100), FULL_LISTING_SCANS - 2, "none"),
    ],
)
def test_what_a_scan_lists(
    before: CreationMark | None, now: CreationMark | None, scans: int, choice: ListingChoice
) -> None:
    assert listing_plan(before, now, scans) == choice


def test_a_candidate_is_looked_at_whenever_its_stamp_is_not_the_one_it_was_read_under() -> None:
    """Whatever the allocator shows: it does not show a pid handed out after root set
    it back."""
    table = {100: 1, 200: 2, 300: 3}
    known = _settled(table, _runner_at(200, 300))
    same = {Pid(200): 2, Pid(300): 3}
    assert looked_at("none", known, same) == frozenset()
    assert looked_at(range(301, 303), known, same) == {301, 302}
    assert looked_at("none", known, {**same, Pid(300): 9}) == {300}
    assert looked_at("none", known, {**same, Pid(300): None}) == {300}
    assert looked_at("none", known, {Pid(200): 2}) == {300}
    assert looked_at(range(301, 302), known, {}) == {200, 300, 301}
    assert looked_at("whole", known, same) is None
    unstamped = dict.fromkeys(table)
    assert looked_at("none", _settled(unstamped, _runner_at(200)), {Pid(200): None}) == {200}


def test_the_scans_since_a_whole_listing_are_counted() -> None:
    known, _ = _scan(Known(), {10: 1})
    assert known.scans_since_whole == 0 and known.mark == MARK
    known, _ = _scan(known, None)
    known, _ = _scan(known, {10: 1}, covered=range(10, 11))
    assert known.scans_since_whole == 2


def _runner_at(*pids: int) -> Reader:
    return lambda pid: "candidate" if pid in pids else "other"


def _unchanged(
    before: Known,
    found: Mapping[int, Stamp | None] | None,
    read: Reader,
    covered: Collection[int] | None,
) -> bool:
    listing = None if found is None else Listing({Pid(pid): s for pid, s in found.items()}, covered)
    reads = plan_reads(before, listing)
    kinds: dict[Pid, Kind] = {pid: read(pid) for pid in reads.pids}
    return nothing_new(before, absorb(before, MARK, listing, reads, kinds), listing, reads)


def test_nothing_is_new_only_when_each_candidate_is_still_the_same_process() -> None:
    """What lets a scan keep the last judgement (`guardian.judgement`)."""
    table = {100: 1, 200: 2, 300: 3}
    runner = _runner_at(200)
    known = _settled(table, runner)
    assert known.candidates == {Pid(200)}
    # No pid handed out since: no listing, the same candidate.
    assert _unchanged(known, None, runner, None)
    # A few pids handed out, none of them the candidate's.
    assert _unchanged(known, {**table, 301: 4}, runner, range(301, 302))
    # The candidate's pid handed out again: another process holds it now.
    assert not _unchanged(known, {**table, 200: 9}, runner, range(200, 201))
    # Nothing handed out that the allocator shows: the candidate alone looked at.
    assert _unchanged(known, {200: 2}, runner, frozenset({200}))
    assert not _unchanged(known, {200: 9}, runner, frozenset({200}))
    assert not _unchanged(known, {}, runner, frozenset({200}))
    # A new candidate, or the candidate no longer one.
    assert not _unchanged(known, {**table, 301: 4}, _runner_at(200, 301), range(301, 302))
    assert not _unchanged(known, None, _others, None)
    # A whole listing (macOS lists whole at every scan) tells by the stamps: the same,
    # a new one, or none (psutil's listing: it cannot tell).
    assert _unchanged(known, table, runner, None)
    assert not _unchanged(known, {**table, 200: 9}, runner, None)
    unstamped = dict.fromkeys(table)
    assert not _unchanged(_settled(unstamped, runner), unstamped, runner, None)
    # The first scan: nothing before it.
    assert not nothing_new(Known(), known, None, plan_reads(Known(), None))
