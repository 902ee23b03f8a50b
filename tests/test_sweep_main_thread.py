"""SIGINT ends an exo runner only on its main thread. A stopped runner gets it on its
main thread while still stopped, then SIGCONT (Linux aims a signal at a thread;
elsewhere it is continued first, and interrupted once it runs). Real runners shaped like exo main's
(the main thread in `queue.Queue.get()`, beside a task reader and busy helper
threads), their worker SIGKILLed, each then stopped (SIGSTOP) as a sweep that froze
its targets used to leave them: every one ends through Python, SIGINT alone.

Before the fix (a sweep froze each target, then sent SIGINT to the process), the
kernel gave each SIGINT to whichever thread ran first after SIGCONT, a helper: the
runner sat on until the busy wait's SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig import notes as runner_notes
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.rig.runner_threads import WAITING
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import settings, signalling
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from tests.helpers.cli import report_of, run_cli
from tests.helpers.sweeps import orphaned_runners
from tests.helpers.waiting import main_thread_settled, wait_for_note, wait_until

RUNNERS = 10
BUSY_WAIT = "15"
"""Short, so that a SIGINT that went astray shows as a SIGKILL in seconds."""


def _stopped_orphans(exo_python: str, notes: Path) -> tuple[scenarios.StartedWorker, list[Any]]:
    kinds: list[RunnerKind] = ["threads"] * RUNNERS
    worker = scenarios.start_worker(kinds, watch="none", python=exo_python, notes=notes)
    runners = orphaned_runners(worker)
    for runner in runners:
        wait_for_note(notes, runner.pid, WAITING)
        assert wait_until(lambda pid=runner.pid: main_thread_settled(pid), 10.0)
        assert signalling.send(runner, signal.SIGSTOP) == "sent"
    assert wait_until(lambda: all(system.is_stopped(r.pid) for r in runners), 10.0)
    return worker, runners


def _events(notes: Path, runner: ProcessIdentity) -> list[str]:
    return [str(note["event"]) for note in runner_notes.read_notes(notes, runner.pid)]


@pytest.mark.machine_wide
@pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc")
def test_the_cli_sweep_interrupts_stopped_runners_on_their_main_threads(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    worker, runners = _stopped_orphans(exo_python, notes)
    try:
        env = dict(os.environ, **{settings.BUSY_WAIT_ENV: BUSY_WAIT})
        report = report_of(run_cli("sweep", "--json", env=env))
        results = {result["pid"]: result for result in report["results"]}
        for runner in runners:
            result = results[runner.pid]
            assert (result["signals"], result["ended"]) == (["SIGINT"], "clean"), result
            assert "atexit" in _events(notes, runner), "SIGINT must unwind it through Python"
    finally:
        scenarios.cleanup(worker)


@pytest.mark.machine_wide
@pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc")
def test_the_worker_hook_sweep_interrupts_stopped_runners_on_their_main_threads(
    exo_python: str, notes: Path, isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sweep()` in process, as exo's worker hook runs it before its plan loop."""
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, BUSY_WAIT)
    worker, runners = _stopped_orphans(exo_python, notes)
    try:
        report = sweep()
        ended = {result.target: result for result in report.results}
        for runner in runners:
            events = _events(notes, runner)
            assert (ended[runner].signals, ended[runner].ended) == (("SIGINT",), "clean"), events
            assert "atexit" in events
    finally:
        scenarios.cleanup(worker)


AMONG_THREADS = """
import queue, threading, time
def wake_often():
    while True:
        time.sleep(0.002)
for _ in range(3):
    threading.Thread(target=wake_often, daemon=True).start()
try:
    print("waiting", flush=True)
    queue.Queue().get()
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""
"""The main thread in a lock wait, three helper threads waking every 2 ms."""


@pytest.mark.skipif(sys.platform != "linux", reason="aims at a thread through Linux's calls")
@pytest.mark.parametrize("thread_pidfds", [True, False])
def test_an_interrupt_reaches_the_main_thread_of_a_stopped_process(
    monkeypatch: pytest.MonkeyPatch, thread_pidfds: bool
) -> None:
    """Both ways Linux aims at the main thread: a thread pidfd (6.9+) and, before it,
    tgkill. Ten stopped processes each: every one raises KeyboardInterrupt."""
    if not thread_pidfds:
        monkeypatch.setattr(signalling, "_thread_pidfds", lambda: False)
    elif not signalling._thread_pidfds():  # pyright: ignore[reportPrivateUsage]
        pytest.skip("this kernel has no thread pidfds (Linux 6.9+)")
    for _ in range(10):
        process = subprocess.Popen(
            [sys.executable, "-c", AMONG_THREADS], stdout=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None and process.stdout.readline() == "waiting\n"
            assert wait_until(lambda pid=process.pid: main_thread_settled(pid), 10.0)
            target = identity_of(process.pid)
            assert target is not None
            assert signalling.send(target, signal.SIGSTOP) == "sent"
            pid = process.pid
            assert wait_until(lambda pid=pid: system.is_stopped(pid) is True, 10.0)
            assert signalling.interrupt(target) == "sent"
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            assert process.poll() is not None, "SIGINT did not reach its main thread"
            assert process.stdout.read() == "interrupted\n"
        finally:
            process.kill()
            process.wait()
