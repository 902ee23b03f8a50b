"""The guardian's cheap scan judges real process tables exactly as a full scan does:
the same verdicts and the same exo processes to watch, while parents die, pids change
hands (chosen through ns_last_pid) and processes exec into runners after they were
first seen, and an exo execs into another program after its evidence was kept
(`process_memo`). And the system calls it stands on. The rules alone, on made-up
listings: test_known_processes; the memo's, on a made-up process: test_process_memo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.guardian import watchlist
from exo_orphan_guard.guardian.cheap_scan import CheapScan
from exo_orphan_guard.guardian.known_processes import FULL_LISTING_SCANS, VERIFY_SCANS, kind_of
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.judging import judge
from exo_orphan_guard.sweeper.process_table import SPAWN_CHILD_FLAG, ProcessTable
from exo_orphan_guard.sweeper.verdicts import SweepOptions, Verdict
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.processes import start_orphan
from tests.helpers.waiting import wait_until

OPTIONS = SweepOptions(fingerprint=True)
SLEEP = "import time; time.sleep(120)"
# Waits for a line on stdin, then execs into a runner's command line.
EXEC_ON_LINE = (
    "import os, sys\n"
    "sys.stdin.readline()\n"
    f"os.execv(sys.executable, [sys.executable, '-c', {SLEEP!r}, {SPAWN_CHILD_FLAG!r}])\n"
)
# Maps exo's extension (the stand-in's), starts a spawn child, then once the FIFO it is
# given closes, execs into another program of the same interpreter, the child its own.
EXO_THEN_EXEC = (
    "import exo_rs, os, subprocess, sys\n"
    f"child = subprocess.Popen([sys.executable, '-c', {SLEEP!r}, {SPAWN_CHILD_FLAG!r}])\n"
    "open(sys.argv[1]).read()\n"
    f"os.execv(sys.executable, [sys.executable, '-c', {SLEEP!r}])\n"
)
THREADED = (
    "import threading, time\n"
    "threading.Thread(target=time.sleep, args=(120,)).start()\n"
    "print('up', flush=True)\n"
    "time.sleep(120)\n"
)
_TRIES = 3

Said = tuple[tuple[int, str, str, str | None], ...]
Watched = dict[ProcessIdentity, frozenset[ProcessIdentity]]


def _said(verdicts: tuple[Verdict, ...]) -> Said:
    return tuple(sorted((v.pid, v.action, v.reason, v.rule) for v in verdicts))


def _full() -> tuple[Said, Watched]:
    table, verdicts = judge(None, OPTIONS, [])
    return _said(verdicts), _watched(table, verdicts)


def _watched(table: ProcessTable, verdicts: tuple[Verdict, ...]) -> Watched:
    return watchlist.exo_processes(table, verdicts)


def _cheap(scan: CheapScan) -> tuple[Said, Watched]:
    table, verdicts = judge(None, OPTIONS, [], scan.candidates(), scan.memo)
    return _said(verdicts), _watched(table, verdicts)


def agree(scan: CheapScan) -> Said:
    return agreed(scan)[0]


def agreed(scan: CheapScan) -> tuple[Said, Watched]:
    """One cheap scan (with its memo, as the guardian's), judged beside full ones: the
    same verdicts and watch list. A full scan before and after it that disagree mean
    the table changed meanwhile (a process of an earlier test leaving): then again,
    with another scan."""
    for _ in range(_TRIES):
        before = _full()
        cheap = _cheap(scan)
        after = _full()
        if before == after:
            assert cheap == before, f"cheap {cheap}\nfull {before}"
            return cheap
    raise AssertionError(f"the process table kept changing over {_TRIES} tries")


def _pids(said: Said) -> set[int]:
    return {pid for pid, _, _, _ in said}


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def _start(
    processes: list[subprocess.Popen[bytes]],
    argv: list[str],
    stdin: int | None = None,
    stdout: int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, stdin=stdin, stdout=stdout)
    processes.append(process)
    return process


def _runner_argv(exo_python: str) -> list[str]:
    return [exo_python, "-c", SLEEP, SPAWN_CHILD_FLAG]


# The system calls -------------------------------------------------------------------


def test_the_listing_shows_processes_and_never_threads(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    threaded = _start(processes, [sys.executable, "-c", THREADED], stdout=subprocess.PIPE)
    assert threaded.stdout is not None and threaded.stdout.readline() == b"up\n"
    tids = {int(tid) for tid in os.listdir(f"/proc/{threaded.pid}/task")} - {threaded.pid}
    assert tids, "its thread"
    listed = system.list_processes()
    among = system.processes_among([threaded.pid, *tids, 2**22 + 1])
    assert threaded.pid in listed and not tids & listed.keys()
    assert set(among) == {threaded.pid}
    assert among[Pid(threaded.pid)] == listed[Pid(threaded.pid)]
    assert system.stamp_of(threaded.pid) == listed[Pid(threaded.pid)]
    assert system.stamp_of(2**22 + 1) is None
    if system.BACKEND == "linux":
        assert listed[Pid(threaded.pid)] is not None
    assert system.command_line(threaded.pid) == dict(system.iter_command_lines())[Pid(threaded.pid)]
    assert system.command_line(2**22 + 1) is None


@pytest.mark.skipif(sys.platform != "linux", reason="the pid allocator of Linux")
def test_the_creation_mark_moves_with_each_process_created(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    before = system.creation_mark()
    started = _start(processes, ["sleep", "120"])
    after = system.creation_mark()
    if system.BACKEND != "linux":
        assert before is None and after is None
        return
    assert before is not None and after is not None
    assert after.forks > before.forks and after.last_pid >= started.pid
    assert after.tasks > 0 and after.pid_max > after.last_pid


# Judged alike ----------------------------------------------------------------------


@pytest.mark.machine_wide
def test_live_and_orphaned_runners_are_judged_alike_and_so_is_a_parent_dying_between_scans(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    _start(processes, ["sleep", "120"])
    orphan = start_orphan(_runner_argv(exo_python))
    worker = scenarios.start_worker(["idle", "idle"], watch="none", python=exo_python)
    try:
        scan = CheapScan()
        agree(scan)  # first sight
        agree(scan)  # settled
        said = agree(scan)  # from what it knows
        runners = {runner.identity.pid for runner in worker.runners}
        assert {orphan.pid, *runners} <= _pids(said)
        os.kill(worker.pid, signal.SIGKILL)
        worker.process.wait()
        assert wait_until(lambda: all(system.parent_pid(pid) != worker.pid for pid in runners), 5)
        said = agree(scan)
        assert {(pid, action) for pid, action, _, _ in said if pid in runners} == {
            (pid, "kill") for pid in runners
        }
    finally:
        scenarios.cleanup(worker)
        os.kill(orphan.pid, signal.SIGKILL)


def _may_choose_pids() -> bool:
    return sys.platform == "linux" and os.access("/proc/sys/kernel/ns_last_pid", os.W_OK)


def _next_pid(pid: int) -> None:
    with open("/proc/sys/kernel/ns_last_pid", "w") as file:
        file.write(str(pid - 1))


@pytest.mark.machine_wide
@pytest.mark.skipif(
    not _may_choose_pids(), reason="choosing the next pid needs root in its own pid namespace"
)
@pytest.mark.parametrize("seen_by", ["a look at the pids handed out", "a whole listing"])
def test_a_pid_that_changed_hands_between_two_scans_is_read_again(
    seen_by: str, exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """A settled process's pid goes to a runner between two scans. The next scan looks
    at the pids handed out since the last (the allocator set back, before that scan,
    so that the runner takes the very pid), or lists every process (the allocator
    gone past it since: as when it wraps round)."""
    innocent = _start(processes, ["sleep", "120"])
    pid = innocent.pid
    scan = CheapScan()
    agree(scan)
    agree(scan)
    if seen_by == "a look at the pids handed out":
        _next_pid(pid)
        agree(scan)
    else:
        _start(processes, ["sleep", "120"])
        agree(scan)
        _next_pid(pid)
    _runner_in_place_of(innocent, processes, exo_python)
    assert pid in _pids(agree(scan))


@pytest.mark.machine_wide
@pytest.mark.skipif(
    not _may_choose_pids(), reason="choosing the next pid needs root in its own pid namespace"
)
def test_a_candidates_pid_that_changed_hands_is_something_new(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """What lets the guardian keep its last judgement (`guardian.judgement`): a scan
    that finds the same candidate pids, one of them now another runner's, found
    something new. The allocator is set back before a scan (that scan lists whole),
    so that the next runner takes the very pid, as in the test above. The portable
    backend's listing has no stamps: there no scan is ever found unchanged."""
    first = _start(processes, _runner_argv(exo_python))
    pid = first.pid
    scan = CheapScan()
    if system.creation_mark() is None:
        for _ in range(3):
            agree(scan)
            assert not scan.unchanged, "a listing without stamps cannot tell"
        return

    def settled() -> bool:
        agree(scan)
        return scan.unchanged

    assert wait_until(settled, timeout=10.0), "nothing new, scan after scan"
    _next_pid(pid)
    agree(scan)
    _runner_in_place_of(first, processes, exo_python)
    # The first scan after it, alone: `agree` scans again when the table changed
    # meanwhile, and a second scan rightly finds nothing new since the first.
    assert pid in scan.candidates()
    assert not scan.unchanged
    assert pid in _pids(agree(scan))


def _runner_in_place_of(
    process: subprocess.Popen[bytes], processes: list[subprocess.Popen[bytes]], exo_python: str
) -> None:
    """Ends `process` and starts a runner that takes its pid (the allocator set back
    to just before it); skips if another process took it first."""
    process.kill()
    process.wait()
    runner = _start(processes, _runner_argv(exo_python))
    if runner.pid != process.pid:
        pytest.skip(f"another process took pid {process.pid} first (the runner got {runner.pid})")
    # Popen returns once the exec began; until it ends, the command line read is ours.
    assert wait_until(lambda: kind_of(system.command_line(runner.pid)) == "candidate", 10)


@pytest.mark.machine_wide
@pytest.mark.skipif(
    not _may_choose_pids(), reason="choosing the next pid needs root in its own pid namespace"
)
def test_a_pid_given_back_by_an_allocator_set_back_is_found_by_the_next_whole_listing(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """Set back to where it stood, the allocator hides the new process from the look
    at pids handed out: the bound is the next whole listing (FULL_LISTING_SCANS)."""
    innocent = _start(processes, ["sleep", "120"])
    pid = innocent.pid
    scan = CheapScan()
    agree(scan)
    agree(scan)
    innocent.kill()
    innocent.wait()
    _next_pid(pid)
    runner = _start(processes, _runner_argv(exo_python))
    if runner.pid != pid:
        pytest.skip(f"another process took pid {pid} first (the runner got {runner.pid})")
    for _ in range(FULL_LISTING_SCANS):
        if pid in scan.candidates():
            break
    else:
        raise AssertionError(f"not found within {FULL_LISTING_SCANS} scans")
    assert pid in _pids(agree(scan))


@pytest.mark.machine_wide
@pytest.mark.skipif(
    not _may_choose_pids(), reason="choosing the next pid needs root in its own pid namespace"
)
def test_a_candidates_pid_given_back_by_an_allocator_set_back_is_seen_at_the_next_scan(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """A candidate's stamp is looked at every scan, whatever the allocator shows: a
    kept judgement (`guardian.judgement`) rests on each candidate being the same
    process. Here its pid goes to another runner and the allocator is set back to
    where the last scan saw it, so the scan lists nothing else."""
    if system.creation_mark() is None:
        pytest.skip("without the allocator's mark every scan lists whole, unstamped: above")
    first = _start(processes, _runner_argv(exo_python))
    pid = first.pid
    scan = CheapScan()

    def settled() -> bool:
        agree(scan)
        return scan.unchanged

    assert wait_until(settled, timeout=10.0), "nothing new, scan after scan"
    mark = system.creation_mark()
    assert mark is not None
    _next_pid(pid)
    _runner_in_place_of(first, processes, exo_python)
    _next_pid(mark.last_pid + 1)
    assert pid in scan.candidates()
    assert not scan.unchanged


@pytest.mark.machine_wide
def test_a_process_that_execs_into_a_runner_after_it_was_first_seen_is_read_again(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """As a spawn child seen between its fork and its exec."""
    late = _start(processes, [exo_python, "-c", EXEC_ON_LINE], stdin=subprocess.PIPE)
    scan = CheapScan()
    assert late.pid not in _pids(agree(scan))
    _exec(late)
    assert late.pid in _pids(agree(scan))


@pytest.mark.machine_wide
def test_a_settled_process_that_execs_into_a_runner_is_read_within_a_turn(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    late = _start(processes, [exo_python, "-c", EXEC_ON_LINE], stdin=subprocess.PIPE)
    scan = CheapScan()
    agree(scan)
    agree(scan)
    _exec(late)
    for _ in range(VERIFY_SCANS):
        if late.pid in scan.candidates():
            break
    else:
        raise AssertionError(f"not read again within {VERIFY_SCANS} scans")
    assert late.pid in _pids(agree(scan))


@pytest.mark.machine_wide
def test_an_exo_that_execs_into_another_program_is_exo_no_more_whatever_was_kept(
    exo_python: str, tmp_path: Path
) -> None:
    """Its evidence (exo's extension mapped) is kept from scan to scan: an exec into
    another program of the same interpreter, same pid and start, drops it, and its
    spawn child is no runner seen under a live exo any more."""
    go = tmp_path / "go"
    os.mkfifo(go)
    exo = start_orphan([exo_python, "-c", EXO_THEN_EXEC, str(go)]).pid
    children: list[int] = []

    def spawned() -> bool:  # its child exec'd: a fork shows its parent's command line
        children[:] = system.child_pids(exo)
        lines = [system.command_line(child) or b"" for child in children]
        return bool(lines) and all(SPAWN_CHILD_FLAG.encode() in line.split(b"\0") for line in lines)

    try:
        assert wait_until(spawned, 10)
        scan = CheapScan()
        for _ in range(3):  # first sight, settled, then from what is kept
            _, watched = agreed(scan)
            assert _runners_of(watched, exo) == set(children)
        with open(go, "w"):
            pass  # its read ends: it execs
        assert wait_until(lambda: b"exo_rs" not in (system.command_line(exo) or b"exo_rs"), 10)
        said, watched = agreed(scan)
        assert _runners_of(watched, exo) is None
        assert set(children) <= _pids(said)
    finally:
        for pid in (exo, *children):
            os.kill(pid, signal.SIGKILL)


def _runners_of(watched: Watched, pid: int) -> set[int] | None:
    """The pids of the runners watched under `pid`; None: it is not watched."""
    found = [runners for process, runners in watched.items() if process.pid == pid]
    return {runner.pid for runner in found[0]} if found else None


def _exec(process: subprocess.Popen[bytes]) -> None:
    assert process.stdin is not None
    process.stdin.write(b"go\n")
    process.stdin.flush()

    def exec_ed() -> bool:
        line = system.command_line(process.pid)
        return line is not None and SPAWN_CHILD_FLAG.encode() in line.split(b"\0")

    assert wait_until(exec_ed, 10), "it did not exec"
