"""The guardian's cheap scan, while pids change hands (chosen through ns_last_pid, in
`scripts/confined`'s pid namespace): the new holder is read again, and a scan that
keeps the last judgement (`guardian.judgement`) never takes it for the old one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.guardian.cheap_scan import CheapScan
from exo_orphan_guard.guardian.known_processes import FULL_LISTING_SCANS, kind_of
from tests.helpers.scan_agreement import agree, pids_said, runner_argv, start
from tests.helpers.waiting import wait_until


def _may_choose_pids() -> bool:
    return sys.platform == "linux" and os.access("/proc/sys/kernel/ns_last_pid", os.W_OK)


pytestmark = [
    pytest.mark.machine_wide,
    pytest.mark.skipif(
        not _may_choose_pids(), reason="choosing the next pid needs root in its own pid namespace"
    ),
]


def _next_pid(pid: int) -> None:
    with open("/proc/sys/kernel/ns_last_pid", "w") as file:
        file.write(str(pid - 1))


@pytest.mark.parametrize("seen_by", ["a look at the pids handed out", "a whole listing"])
def test_a_pid_that_changed_hands_between_two_scans_is_read_again(
    seen_by: str, exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """A settled process's pid goes to a runner between two scans. The next scan looks
    at the pids handed out since the last (the allocator set back, before that scan,
    so that the runner takes the very pid), or lists every process (the allocator
    gone past it since: as when it wraps round)."""
    innocent = start(processes, ["sleep", "120"])
    pid = innocent.pid
    scan = CheapScan()
    agree(scan)
    agree(scan)
    if seen_by == "a look at the pids handed out":
        _next_pid(pid)
        agree(scan)
    else:
        start(processes, ["sleep", "120"])
        agree(scan)
        _next_pid(pid)
    _runner_in_place_of(innocent, processes, exo_python)
    assert pid in pids_said(agree(scan))


def test_a_candidates_pid_that_changed_hands_is_something_new(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """What lets the guardian keep its last judgement (`guardian.judgement`): a scan
    that finds the same candidate pids, one of them now another runner's, found
    something new. The allocator is set back before a scan (that scan lists whole),
    so that the next runner takes the very pid, as in the test above. The portable
    backend's listing has no stamps: there no scan is ever found unchanged."""
    first = start(processes, runner_argv(exo_python))
    pid = first.pid
    scan = CheapScan()
    if system.creation_mark() is None:
        for _ in range(3):
            agree(scan)
            assert not scan.unchanged, "a listing without stamps cannot tell"
        return

    _settle(scan)
    _next_pid(pid)
    agree(scan)
    _runner_in_place_of(first, processes, exo_python)
    # The first scan after it, alone: `agree` scans again when the table changed
    # meanwhile, and a second scan rightly finds nothing new since the first.
    assert pid in scan.candidates()
    assert not scan.unchanged
    assert pid in pids_said(agree(scan))


def _settle(scan: CheapScan) -> None:
    """Scans until one finds nothing new: one that may keep the last judgement."""

    def settled() -> bool:
        agree(scan)
        return scan.unchanged

    assert wait_until(settled, timeout=10.0), "nothing new, scan after scan"


def _runner_in_place_of(
    process: subprocess.Popen[bytes], processes: list[subprocess.Popen[bytes]], exo_python: str
) -> None:
    """Ends `process` and starts a runner that takes its pid (the allocator set back
    to just before it); skips if another process took it first."""
    process.kill()
    process.wait()
    runner = start(processes, runner_argv(exo_python))
    if runner.pid != process.pid:
        pytest.skip(f"another process took pid {process.pid} first (the runner got {runner.pid})")
    # Popen returns once the exec began; until it ends, the command line read is ours.
    assert wait_until(lambda: kind_of(system.command_line(runner.pid)) == "candidate", 10)


def test_a_pid_given_back_by_an_allocator_set_back_is_found_by_the_next_whole_listing(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """Set back to where it stood, the allocator hides the new process from the look
    at pids handed out: the bound is the next whole listing (FULL_LISTING_SCANS)."""
    innocent = start(processes, ["sleep", "120"])
    pid = innocent.pid
    scan = CheapScan()
    agree(scan)
    agree(scan)
    innocent.kill()
    innocent.wait()
    _next_pid(pid)
    runner = start(processes, runner_argv(exo_python))
    if runner.pid != pid:
        pytest.skip(f"another process took pid {pid} first (the runner got {runner.pid})")
    for _ in range(FULL_LISTING_SCANS):
        if pid in scan.candidates():
            break
    else:
        raise AssertionError(f"not found within {FULL_LISTING_SCANS} scans")
    assert pid in pids_said(agree(scan))


def test_a_candidates_pid_given_back_by_an_allocator_set_back_is_seen_at_the_next_scan(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """A candidate's stamp is looked at every scan, whatever the allocator shows: a
    kept judgement (`guardian.judgement`) rests on each candidate being the same
    process. Here its pid goes to another runner and the allocator is set back to
    where the last scan saw it, so the scan lists nothing else."""
    if system.creation_mark() is None:
        pytest.skip("without the allocator's mark every scan lists whole, unstamped: above")
    first = start(processes, runner_argv(exo_python))
    pid = first.pid
    scan = CheapScan()

    _settle(scan)
    mark = system.creation_mark()
    assert mark is not None
    _next_pid(pid)
    _runner_in_place_of(first, processes, exo_python)
    _next_pid(mark.last_pid + 1)
    assert pid in scan.candidates()
    assert not scan.unchanged
