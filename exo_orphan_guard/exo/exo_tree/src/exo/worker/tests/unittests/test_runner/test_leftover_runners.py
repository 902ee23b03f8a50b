"""exo's real Worker, starting with runners a dead exo left behind: the recorded
leftover is ended before the plan loop, the clean way first; a live exo's runner and
an unrecorded process are left alone."""

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import final

import anyio
import psutil
import pytest
from loguru import logger

import exo.worker.main as worker_main
from exo.shared.types.commands import ForwarderCommand, ForwarderDownloadCommand
from exo.shared.types.events import Event, IndexedEvent
from exo.utils.channels import channel
from exo.worker.main import Worker
from exo.worker.runner import leftover_runners
from exo.worker.runner.runner_record import (
    ProcessIdentity,
    RunnerRecord,
    identity_of,
    read_records,
)
from exo.worker.tests.constants import NODE_A

# A runner as the sweep sees one: a `--multiprocessing-fork` child of its worker,
# recorded by exo's own record_runner (or not), waiting on its main thread.
_RUNNER = """
import os, signal, sys, threading
from pathlib import Path
from exo.worker.runner.runner_record import record_runner
# Python's own SIGINT handler, also where SIGINT came in ignored (a shell's
# background job), which Python would leave ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
kind, directory = sys.argv[1], Path(sys.argv[2])
if kind != "unrecorded":
    record_runner(directory / "runners", os.getppid())
if kind == "holds-on":
    signal.signal(signal.SIGINT, lambda *_: (directory / f"{os.getpid()}.sigint").touch())
print(os.getpid(), flush=True)
try:
    threading.Event().wait()
except KeyboardInterrupt:
    (directory / f"{os.getpid()}.interrupted").touch()
"""

# The runners' worker: starts them, says their pids, and waits to be killed.
_WORKER = """
import subprocess, sys
runners = [
    subprocess.Popen(
        [sys.executable, "-c", sys.argv[1], kind, sys.argv[2], "--multiprocessing-fork"],
        stdout=subprocess.PIPE,
    )
    for kind in sys.argv[3:]
]
print(*(int(runner.stdout.readline()) for runner in runners), flush=True)
sys.stdin.read()
"""


@final
class _Runners:
    """Runners of one worker, by kind: recorded, holds-on (recorded, takes SIGINT
    without ending), unrecorded. Started at once; `started` waits for them, so that
    several workers start side by side."""

    def __init__(self, directory: Path, *kinds: str) -> None:
        self.worker = subprocess.Popen(
            [sys.executable, "-c", _WORKER, _RUNNER, str(directory), *kinds],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._kinds = kinds
        self.runners: list[psutil.Process] = []

    def started(self) -> list[psutil.Process]:
        """The runners, once each has recorded itself (or not) and said its pid."""
        assert self.worker.stdout is not None
        pids = [int(pid) for pid in self.worker.stdout.readline().split()]
        assert len(pids) == len(self._kinds)
        self.runners = [psutil.Process(pid) for pid in pids]
        return self.runners

    def kill_worker(self) -> None:
        self.worker.kill()
        self.worker.wait()

    def close(self) -> None:
        for runner in self.runners:
            with contextlib.suppress(psutil.Error):
                runner.kill()
        self.kill_worker()


@final
class PlanReachedError(Exception):
    pass


def _alive(process: psutil.Process) -> bool:
    # a zombie is gone: its parent, here the pid namespace's init, has yet to reap it
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def runners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[_Runners]]:
    monkeypatch.setattr(leftover_runners, "EXO_ORPHAN_GUARD", True)
    monkeypatch.setattr(
        leftover_runners, "EXO_RUNNER_RECORDS_DIR", tmp_path / "runners"
    )
    started: list[_Runners] = []
    yield started
    for each in started:
        each.close()


def _worker() -> Worker:
    event_sender, _ = channel[Event]()
    _, event_receiver = channel[IndexedEvent]()
    command_sender, _ = channel[ForwarderCommand]()
    download_command_sender, _ = channel[ForwarderDownloadCommand]()
    return Worker(
        NODE_A,
        event_receiver=event_receiver,
        event_sender=event_sender,
        command_sender=command_sender,
        download_command_sender=download_command_sender,
        api_port=52415,
    )


async def test_worker_ends_a_recorded_leftover_before_its_plan_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runners: list[_Runners]
) -> None:
    dead = _Runners(tmp_path, "recorded", "unrecorded")
    live = _Runners(tmp_path, "recorded")
    runners += [dead, live]
    leftover, unrecorded = dead.started()
    (live_runner,) = live.started()
    dead_worker = identity_of(dead.worker.pid)
    assert dead_worker is not None
    # records that name the wrong process: a reused pid (another start time), and a
    # process that is no multiprocessing child (this test's own)
    reused = ProcessIdentity(pid=unrecorded.pid, started=unrecorded.create_time() + 1)
    this_test = identity_of(os.getpid())
    assert this_test is not None
    for name, runner in (("reused", reused), ("this-test", this_test)):
        record = RunnerRecord(runner=runner, worker=dead_worker)
        (tmp_path / "runners" / f"{name}.json").write_text(record.model_dump_json())
    # and a file that is no record at all: removed, never raised
    corrupt = tmp_path / "runners" / "corrupt.json"
    corrupt.write_text('{"runner": {"pid": 1')
    dead.kill_worker()

    leftover_at_plan: list[bool] = []

    def plan(*_: object) -> None:
        leftover_at_plan.append(_alive(leftover))
        raise PlanReachedError

    monkeypatch.setattr(worker_main, "plan", plan)
    with anyio.fail_after(30), pytest.raises(PlanReachedError):
        await _worker().plan_step()

    assert leftover_at_plan == [False]
    assert (tmp_path / f"{leftover.pid}.interrupted").exists()  # SIGINT, not SIGKILL
    assert _alive(live_runner) and _alive(unrecorded)
    recorded = [record.runner.pid for _, record in read_records(tmp_path / "runners")]
    assert sorted(recorded) == sorted([live_runner.pid, os.getpid()])
    assert not corrupt.exists()


async def test_a_leftover_that_does_not_end_on_sigint_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runners: list[_Runners]
) -> None:
    # the bound runs out whatever its length: this runner never ends on SIGINT
    monkeypatch.setattr(leftover_runners, "LEFTOVER_RUNNER_INTERRUPT_SECONDS", 0.1)
    dead = _Runners(tmp_path, "holds-on")
    runners.append(dead)
    (leftover,) = dead.started()
    dead.kill_worker()
    said: list[str] = []
    sink = logger.add(lambda message: said.append(str(message).strip()), level="INFO")
    try:
        with anyio.fail_after(30):
            await leftover_runners.end_leftover_runners()
    finally:
        logger.remove(sink)

    assert not _alive(leftover)
    assert said[-1].endswith(f"Leftover runner {leftover.pid} ended by SIGKILL"), said
    assert read_records(tmp_path / "runners") == []


async def test_exo_stopping_does_not_wait_for_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runners: list[_Runners]
) -> None:
    monkeypatch.setattr(leftover_runners, "LEFTOVER_RUNNER_INTERRUPT_SECONDS", 3600)
    dead = _Runners(tmp_path, "holds-on")
    runners.append(dead)
    (leftover,) = dead.started()
    dead.kill_worker()
    threads = threading.active_count()

    # the cancel is what exo's stop does to the plan loop; the bound only keeps a
    # sweep that ignored it from hanging the test
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_worker().plan_step)
            while not (tmp_path / f"{leftover.pid}.sigint").exists():
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    assert threading.active_count() == threads
    assert _alive(leftover)
