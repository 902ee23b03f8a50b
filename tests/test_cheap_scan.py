"""The guardian's cheap scan judges real process tables exactly as a full scan does:
the same verdicts and the same exo processes to watch, while parents die, processes
exec into runners after they were first seen, and an exo execs into another program
after its evidence was kept (`process_memo`). And the system calls it stands on.
Pids that change hands: test_cheap_scan_pids. The rules alone, on made-up listings:
test_known_processes; the memo's, on a made-up process: test_process_memo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.guardian.cheap_scan import CheapScan
from exo_orphan_guard.guardian.known_processes import VERIFY_SCANS
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.process_table import SPAWN_CHILD_FLAG
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.processes import start_orphan
from tests.helpers.scan_agreement import (
    SLEEP,
    Watched,
    agree,
    agreed,
    pids_said,
    runner_argv,
    start,
)
from tests.helpers.waiting import wait_until

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


# The system calls -------------------------------------------------------------------


def test_the_listing_shows_processes_and_never_threads(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    threaded = start(processes, [sys.executable, "-c", THREADED], stdout=subprocess.PIPE)
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
    started = start(processes, ["sleep", "120"])
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
    start(processes, ["sleep", "120"])
    orphan = start_orphan(runner_argv(exo_python))
    worker = scenarios.start_worker(["idle", "idle"], watch="none", python=exo_python)
    try:
        scan = CheapScan()
        agree(scan)  # first sight
        agree(scan)  # settled
        said = agree(scan)  # from what it knows
        runners = {runner.identity.pid for runner in worker.runners}
        assert {orphan.pid, *runners} <= pids_said(said)
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


@pytest.mark.machine_wide
def test_a_process_that_execs_into_a_runner_after_it_was_first_seen_is_read_again(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """As a spawn child seen between its fork and its exec."""
    late = start(processes, [exo_python, "-c", EXEC_ON_LINE], stdin=subprocess.PIPE)
    scan = CheapScan()
    assert late.pid not in pids_said(agree(scan))
    _exec(late)
    assert late.pid in pids_said(agree(scan))


@pytest.mark.machine_wide
def test_a_settled_process_that_execs_into_a_runner_is_read_within_a_turn(
    exo_python: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    late = start(processes, [exo_python, "-c", EXEC_ON_LINE], stdin=subprocess.PIPE)
    scan = CheapScan()
    agree(scan)
    agree(scan)
    _exec(late)
    for _ in range(VERIFY_SCANS):
        if late.pid in scan.candidates():
            break
    else:
        raise AssertionError(f"not read again within {VERIFY_SCANS} scans")
    assert late.pid in pids_said(agree(scan))


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
        assert set(children) <= pids_said(said)
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
