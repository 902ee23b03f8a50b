"""Terminal behaviour in a real pty: the runner leads its own process group.

Before the guard, runners shared the worker's (foreground) group: Ctrl-C reached them
all, and their writes to the terminal were a foreground job's. Each test runs the same
job with the guard on and off: the guard must be no worse.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.rig.scenario_worker import Watch, WorkerReport, WorkerSpec
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.processes import describe
from tests.helpers.waiting import wait_until

SHELL = Path(__file__).parent / "helpers" / "pty_shell.py"
CTRL_C = b"\x03"


@dataclass
class Terminal:
    """The master side of a pty, read continuously so that no writer ever blocks.

    The reader closes the master itself, once every slave side is closed: closed under
    it, its number went to the next test's pipe, and the reader took that output (a
    shell's `echo $!` in `start_orphan`, twice in 2026-12-04's fresh-clone runs)."""

    master: int
    output: bytearray = field(default_factory=bytearray)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None

    def start(self) -> None:
        self.reader = threading.Thread(target=self._read_until_closed, daemon=True)
        self.reader.start()

    def _read_until_closed(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    return  # EIO: every slave side is closed
                if not chunk:
                    return
                with self.lock:
                    self.output.extend(chunk)
        finally:
            os.close(self.master)

    def closed(self, timeout: float) -> bool:
        """Whether the reader has ended (and closed the master) within `timeout`."""
        assert self.reader is not None
        self.reader.join(timeout)
        return not self.reader.is_alive()

    def text(self) -> str:
        with self.lock:
            return self.output.decode(errors="replace")

    def wait_for_report(self, timeout: float) -> WorkerReport:
        """The worker's JSON line, whole: runners may be writing to the terminal too."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.text().splitlines():
                start = line.find('{"worker"')
                if start >= 0:
                    # The worker's newline may come after a runner's line.
                    with contextlib.suppress(ValueError):
                        report: WorkerReport = json.JSONDecoder().raw_decode(line[start:])[0]
                        return report
            assert time.monotonic() < deadline, f"no worker report in {self.text()!r}"
            time.sleep(0.01)

    def wait_for(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            assert time.monotonic() < deadline, f"{needle!r} not seen in {self.text()!r}"
            time.sleep(0.01)
        return self.text()


@dataclass
class Job:
    terminal: Terminal
    shell: subprocess.Popen[bytes]
    worker: ProcessIdentity
    runners: list[ProcessIdentity]
    everyone: list[ProcessIdentity]


RunJob = Callable[[list[RunnerKind], Watch, str], Job]


@pytest.fixture
def run_job(isolated_environment: Path) -> Iterator[RunJob]:
    jobs: list[Job] = []

    def run(runners: list[RunnerKind], watch: Watch, mode: str) -> Job:
        master, slave = os.openpty()
        spec = WorkerSpec(
            runners=runners, watch=watch, spawn_from="main", go_file="/nonexistent", notes=""
        )
        env = scenarios.scenario_environment(watch, registry=isolated_environment)
        argv = [sys.executable, "-m", "exo_orphan_guard.rig.scenario_worker", json.dumps(spec)]
        shell = subprocess.Popen(
            [sys.executable, str(SHELL), mode, *argv],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env=env,
        )
        os.close(slave)
        terminal = Terminal(master)
        terminal.start()
        report = terminal.wait_for_report(30.0)
        worker = identity_of(report["worker"])
        assert worker is not None
        runner_pids = [entry["pid"] for entry in report["runners"]]
        members = [Pid(pid) for pid in runner_pids]
        for pid in runner_pids:
            members.extend(system.descendants(pid))
        identities = [identity for pid in members if (identity := identity_of(pid)) is not None]
        job = Job(
            terminal,
            shell,
            worker,
            [identity for identity in identities if identity.pid in runner_pids],
            [worker, *identities],
        )
        jobs.append(job)
        return job

    yield run
    for job in jobs:
        for identity in job.everyone:
            if scenarios.alive([identity]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(identity.pid, signal.SIGKILL)
        job.shell.kill()
        job.shell.wait()
        scenarios.wait_gone(job.everyone, 5.0)
        assert job.terminal.closed(10.0), f"a slave side of the pty is still open: {job}"


@pytest.mark.parametrize("watch", ["guard", "none"])
def test_ctrl_c_on_the_foreground_worker_ends_everything(run_job: RunJob, watch: Watch) -> None:
    job = run_job(["idle", "gil", "child"], watch, "plain")
    assert scenarios.alive(job.everyone) == job.everyone
    os.write(job.terminal.master, CTRL_C)
    job.terminal.wait_for("shell: job exited", 10.0)
    exits = scenarios.wait_gone(job.everyone, 5.0)
    left = [identity for identity, seen in exits.items() if seen is None]
    assert not left, (watch, describe([identity.pid for identity in left]), job.terminal.text())


@pytest.mark.parametrize("watch", ["guard", "none"])
def test_a_runner_writing_under_tostop_is_never_left_stopped(run_job: RunJob, watch: Watch) -> None:
    job = run_job(["talk"], watch, "tostop")
    (runner,) = job.runners

    def ticks() -> int:
        return job.terminal.text().count(f"runner {runner.pid} tick")

    before = ticks()
    # A runner stopped by its first write under TOSTOP writes no more.
    assert wait_until(lambda: ticks() > before + 5, 10.0), (watch, job.terminal.text())
    assert psutil.Process(runner.pid).status() != psutil.STATUS_STOPPED, watch
    # Still guarded: the worker's death takes it, stopped or not.
    os.kill(job.worker.pid, signal.SIGKILL)
    if watch == "guard":
        exits = scenarios.wait_gone(job.runners, 10.0)
        assert all(seen is not None for seen in exits.values()), exits
