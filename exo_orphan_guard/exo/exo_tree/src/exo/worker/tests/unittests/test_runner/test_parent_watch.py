"""exo's real entrypoint and Runner, idle, whose worker is SIGKILLed: with
EXO_ORPHAN_GUARD on the runner takes Shutdown and ends through Runner.shutdown; with
it off it is left running without its worker."""

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast, final

import anyio
import psutil
import pytest
from anyio import ClosedResourceError, EndOfStream, to_thread
from loguru import logger

from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.events import Event, RunnerStatusUpdated
from exo.shared.types.tasks import Task, TaskId
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import (
    RunnerId,
    RunnerIdle,
    RunnerShuttingDown,
)
from exo.utils.channels import MpReceiver, MpSender, mp_channel
from exo.worker.runner.bootstrap import RunnerTerminationError, entrypoint
from exo.worker.runner.runner_record import RunnerRecord
from exo.worker.tests.unittests.conftest import get_bound_mlx_ring_instance

type RunnerEvent = Event | RunnerTerminationError
_WORKER_START = "fork" if sys.platform == "linux" else "spawn"
START_BOUND = 300
END_BOUND = 60


@pytest.fixture
def spawn() -> Iterator[None]:
    """exo's start method (set in exo.main), on Linux too."""
    before = mp.get_start_method(allow_none=True)
    mp.set_start_method("spawn", force=True)
    yield
    mp.set_start_method(before, force=True)


def _worker(
    guard: str,
    events: MpSender[RunnerEvent],
    tasks: MpReceiver[Task],
    cancels: MpReceiver[TaskId],
    report: Connection,
) -> None:
    """The runner's parent, spawning exo's entrypoint as the supervisor does."""
    os.environ["EXO_ORPHAN_GUARD"] = guard
    mp.set_start_method("spawn", force=True)
    logger.remove()  # the default stderr sink cannot be pickled into the runner
    bound_instance = get_bound_mlx_ring_instance(
        instance_id=InstanceId("instance-a"),
        model_id=ModelId("mlx-community/Llama-3.2-1B-Instruct-4bit"),
        runner_id=RunnerId("runner-a"),
        node_id=NodeId("node-a"),
    )
    runner = mp.Process(
        target=entrypoint,
        args=(bound_instance, events, tasks, cancels, logger),
        daemon=True,
    )
    runner.start()
    report.send(runner.pid)
    runner.join()


@final
class _Runner:
    def __init__(self, guard: str) -> None:
        self.events, self._events_rx = mp_channel[RunnerEvent]()
        self._tasks, tasks_rx = mp_channel[Task]()
        self._cancels, cancels_rx = mp_channel[TaskId]()
        report, report_tx = mp.Pipe(duplex=False)
        # The worker is scaffolding, not exo's: forked where that is safe and quick
        # (Linux), spawned on macOS, whose default it is. exo's runner is spawned.
        self.worker = mp.get_context(_WORKER_START).Process(
            target=_worker,
            args=(guard, self.events, tasks_rx, cancels_rx, report_tx),
        )
        self.worker.start()
        report_tx.close()  # the worker's death ends the report
        self._report = report
        self.process: psutil.Process | None = None
        self._statuses: queue.Queue[object] = queue.Queue()

    def _read(self) -> None:
        with contextlib.suppress(ClosedResourceError, EndOfStream):
            while True:
                event = self._events_rx.receive()
                if isinstance(event, RunnerStatusUpdated | RunnerTerminationError):
                    self._statuses.put(
                        event
                        if isinstance(event, RunnerTerminationError)
                        else event.runner_status
                    )
        self._statuses.put(None)

    async def idle(self) -> psutil.Process:
        # Read as they come, from here on: once the runner closes its event stream (as
        # it exits), a receive refuses what is still buffered. Started once both
        # workers are forked: a fork copies no thread, and warns of those it leaves.
        threading.Thread(target=self._read, daemon=True).start()
        pid = cast(int, await to_thread.run_sync(self._report.recv))
        self.process = psutil.Process(pid)
        assert isinstance(await self.next_status(), RunnerIdle)
        return self.process

    async def next_status(self) -> object:
        status = await to_thread.run_sync(self._statuses.get, abandon_on_cancel=True)
        assert not isinstance(status, RunnerTerminationError), str(status)
        return status

    def close(self) -> None:
        if self.process is not None:
            with contextlib.suppress(psutil.Error):
                self.process.kill()
        self.worker.kill()
        self.worker.join()
        self.events.close()  # ends the reader
        self._statuses.put(None)  # and a next_status left waiting by a failed test


@pytest.mark.usefixtures("spawn")
async def test_runner_ends_through_shutdown_when_its_worker_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXO_HOME", str(tmp_path))
    guarded, unguarded = _Runner("true"), _Runner("false")
    try:
        # Bounds on a hang only: a loaded machine takes long to import exo's runner.
        with anyio.fail_after(START_BOUND):
            runner = await guarded.idle()
            orphan = await unguarded.idle()
        for parent in (guarded.worker, unguarded.worker):
            assert parent.pid is not None
            os.kill(parent.pid, signal.SIGKILL)
            parent.join()
        with anyio.fail_after(END_BOUND):
            # only Runner.shutdown sends it; what it sends last may be lost, as the
            # runner's exit closes the channel for every process
            assert await guarded.next_status() == RunnerShuttingDown()
            await to_thread.run_sync(runner.wait, END_BOUND)
        assert orphan.is_running()
        assert orphan.ppid() != unguarded.worker.pid

        (record_path,) = (tmp_path / "runners").glob("*.json")
        record = RunnerRecord.model_validate_json(record_path.read_bytes())
        assert (record.runner.pid, record.worker.pid) == (
            runner.pid,
            guarded.worker.pid,
        )
    finally:
        guarded.close()
        unguarded.close()
