"""Does exo's REAL ``Worker.plan_step`` sweep orphans before it forwards ConnectToGroup?

Run it with the python of an environment made by ``scripts/exo-venv <tree> <cache>``
for a tree patched with ``exo-orphan-guard patch apply --exo <tree>``, in which
``import exo_orphan_guard`` works (a ``.pth`` in the venv's site-packages, say)::

    <venv>/bin/python tests/exo_support/connect_to_group_check.py --version main
    <venv>/bin/python tests/exo_support/connect_to_group_check.py --version v1.0.71

What it does:

1. Builds a real ``exo.worker.main.Worker`` on in-process ``channel``s and gives it a
   ``State`` for which exo's real ``plan()`` returns ``ConnectToGroup``: a two-node
   MLX ring instance (exo's own fixture ``get_bound_mlx_ring_instance``), this node
   rank 0 of 2, both runners ``RunnerIdle``, the model ``DownloadCompleted`` here
   (else plan() asks for a download first).
2. Puts a fake supervisor in ``worker.runners``: plan() reads ``bound_instance``,
   ``status``, ``completed``, ``in_progress``, ``cancelled``; ``start_task`` records
   the task, the time, and whether the orphan was still alive at that moment.
3. Plants two processes that look like exo runners (the venv's python with
   ``--multiprocessing-fork`` in argv): an orphan, detached through ``sh -c '... &'``
   so its parent is init (or a subreaper), and "this worker's own runner", a direct
   child. The sweep must kill the first and spare the second.
4. With EXO_ORPHAN_GUARD=1 and EXO_ORPHAN_GUARD_DIR=<temp dir>, calls the patched
   ``orphan_guard.prepare_worker()`` (as ``Worker.run`` does) and runs only
   ``worker.plan_step()`` until the fake supervisor receives ConnectToGroup
   (``--timeout``, default 30 s).

Prints ONE JSON line on stdout::

    {"connect_to_group_forwarded": ..., "orphan_killed": ..., "own_runner_alive": ...,
     "sweep_before_forward": ..., "version": ...}

and exits 0 when all four are true, else 1. exo's logs and this script's notes go
to stderr. On an unpatched tree (no ``exo.worker.orphan_guard``) nothing sweeps, so
``orphan_killed`` is false: that is how the check fails. Every process started here
is killed on the way out.

Caveat: the sweep is the real, machine-wide one. It also kills other orphaned
exo-looking spawn children of this user (another test's planted orphan), and
another test's sweep can kill ours.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The shared set-up sits next to this script (stdlib and psutil only). No .pyc next
# to the sources.
sys.dont_write_bytecode = True
from check_setup import (  # noqa: E402
    Planted,
    prepare_env,
    report_guard_wiring,
    start_orphan,
    start_own_runner,
)

VERSIONS = ("main", "v1.0.71")
WARM_UP = (
    "exo.worker.main",
    "exo.worker.tests.unittests.conftest",
    "exo_orphan_guard.exo.worker",
    "exo_orphan_guard.sweeper.sweeping",
)


def note(message: str) -> None:
    print(f"connect_to_group_check: {message}", file=sys.stderr, flush=True)


# --- the fake supervisor -------------------------------------------------------


@dataclass
class FakeSupervisor:
    """What plan() and plan_step read from a RunnerSupervisor, without a runner."""

    bound_instance: Any
    status: Any
    orphan: Planted
    completed: set[Any] = field(default_factory=set)
    in_progress: set[Any] = field(default_factory=set)
    cancelled: set[Any] = field(default_factory=set)
    pending: dict[Any, Any] = field(default_factory=dict)
    received: list[tuple[Any, float, bool]] = field(default_factory=list)
    """(task, monotonic time, orphan alive at that moment) per start_task call."""
    got_connect_to_group: Any = None  # an anyio.Event, made inside the event loop

    async def start_task(self, task: Any) -> None:
        from exo.shared.types.tasks import ConnectToGroup
        from exo.shared.types.worker.runners import RunnerConnecting

        self.received.append((task, time.monotonic(), self.orphan.alive()))
        note(f"fake supervisor got {type(task).__name__}")
        self.status = RunnerConnecting()  # as the runner's acknowledgement would
        if isinstance(task, ConnectToGroup) and self.got_connect_to_group is not None:
            self.got_connect_to_group.set()

    async def cancel_task(self, task_id: Any) -> None:
        self.cancelled.add(task_id)

    def shutdown(self) -> None:
        pass


# --- exo ---------------------------------------------------------------------


def ring_worker() -> tuple[Any, Any, tuple[Any, ...]]:
    """exo's real Worker on node A, with a two-node ring instance (this node rank 0)
    downloaded and every runner idle: the worker, this node's bound instance, and the
    receivers to close at the end. Keep them referenced meanwhile: a send into a
    channel whose receivers are all gone raises BrokenResourceError (plan_step sends
    TaskCreated first)."""
    from exo.shared.models.model_cards import ModelId
    from exo.shared.types.commands import ForwarderCommand, ForwarderDownloadCommand
    from exo.shared.types.events import Event, IndexedEvent
    from exo.shared.types.memory import Memory
    from exo.shared.types.state import State
    from exo.shared.types.worker.downloads import DownloadCompleted
    from exo.shared.types.worker.instances import InstanceId
    from exo.shared.types.worker.runners import RunnerId, RunnerIdle
    from exo.utils.channels import channel
    from exo.worker.main import Worker
    from exo.worker.tests.constants import INSTANCE_1_ID, MODEL_A_ID, NODE_A, RUNNER_1_ID
    from exo.worker.tests.unittests.conftest import get_bound_mlx_ring_instance

    bound = get_bound_mlx_ring_instance(
        instance_id=InstanceId(INSTANCE_1_ID),
        model_id=ModelId(MODEL_A_ID),
        runner_id=RunnerId(RUNNER_1_ID),
        node_id=NODE_A,
    )
    instance = bound.instance
    assert bound.bound_shard.device_rank == 0 and bound.bound_shard.world_size == 2

    event_sender, event_receiver = channel[Event]()
    _indexed_sender, indexed_receiver = channel[IndexedEvent]()
    command_sender, command_receiver = channel[ForwarderCommand]()
    download_sender, download_receiver = channel[ForwarderDownloadCommand]()
    worker = Worker(
        NODE_A,
        event_receiver=indexed_receiver,
        event_sender=event_sender,
        command_sender=command_sender,
        download_command_sender=download_sender,
        api_port=52415,
    )
    worker.state = State(
        instances={instance.instance_id: instance},
        runners={runner: RunnerIdle() for runner in instance.shard_assignments.runner_to_shard},
        downloads={
            NODE_A: [
                DownloadCompleted(
                    node_id=NODE_A,
                    shard_metadata=bound.bound_shard,
                    total=Memory.from_mb(100000),
                )
            ]
        },
    )
    return worker, bound, (event_receiver, indexed_receiver, command_receiver, download_receiver)


async def drive_plan_step(orphan: Planted, timeout: float) -> FakeSupervisor:
    import anyio
    from exo.shared.types.worker.runners import RunnerIdle

    worker, bound, receivers = ring_worker()
    fake = FakeSupervisor(bound_instance=bound, status=RunnerIdle(), orphan=orphan)
    fake.got_connect_to_group = anyio.Event()
    worker.runners[bound.bound_runner_id] = fake  # pyright: ignore[reportArgumentType]
    other = other_instance(worker, orphan)

    with anyio.move_on_after(timeout) as scope:
        # plan_step runs inside the Worker's own task group, as Worker.run runs it.
        async with worker._tg as tg:  # pyright: ignore[reportPrivateUsage]
            tg.start_soon(worker.plan_step)
            await fake.got_connect_to_group.wait()
            await anyio.sleep(0.5)  # a second ConnectToGroup would arrive by now
            tg.cancel_scope.cancel()
    if scope.cancelled_caught:
        note(f"no ConnectToGroup within {timeout:g} s")
    for receiver in receivers:
        receiver.close()
    fake.received += [entry for entry in other.received if entry not in fake.received]
    return fake


def other_instance(worker: Any, orphan: Planted) -> FakeSupervisor:
    """A single-node instance on this node, for which plan() asks for LoadModel once
    the two-node one's ConnectToGroup is out of its way."""
    from exo.shared.models.model_cards import ModelId
    from exo.shared.types.worker.instances import BoundInstance, InstanceId
    from exo.shared.types.worker.runners import RunnerId, RunnerIdle
    from exo.worker.tests.constants import INSTANCE_2_ID, MODEL_A_ID, NODE_A, RUNNER_2_ID
    from exo.worker.tests.unittests.conftest import (
        get_mlx_ring_instance,
        get_pipeline_shard_metadata,
    )

    shard = get_pipeline_shard_metadata(model_id=ModelId(MODEL_A_ID), device_rank=0, world_size=1)
    instance = get_mlx_ring_instance(
        instance_id=InstanceId(INSTANCE_2_ID),
        model_id=ModelId(MODEL_A_ID),
        node_to_runner={NODE_A: RunnerId(RUNNER_2_ID)},
        runner_to_shard={RunnerId(RUNNER_2_ID): shard},
    )
    bound = BoundInstance(
        instance=instance, bound_runner_id=RunnerId(RUNNER_2_ID), bound_node_id=NODE_A
    )
    worker.state = worker.state.model_copy(
        update={
            "instances": {**worker.state.instances, instance.instance_id: instance},
            "runners": {**worker.state.runners, RunnerId(RUNNER_2_ID): RunnerIdle()},
        }
    )
    fake = FakeSupervisor(bound_instance=bound, status=RunnerIdle(), orphan=orphan)
    worker.runners[bound.bound_runner_id] = fake
    return fake


def start_busy_orphan() -> tuple[Planted, Any]:
    """A guarded runner whose worker was killed while it was ending the clean way (a
    Shutdown under way): the sweep waits for it, up to its grace, and never signals it."""
    from exo_orphan_guard.rig import scenarios
    from exo_orphan_guard.rig.scenario_worker import SHUTDOWN_SECONDS_ENV

    registry = Path(os.environ["EXO_ORPHAN_GUARD_DIR"])
    # Three seconds of shutdown: long enough that the wait is seen on a loaded machine.
    started = scenarios.start_worker(
        ["shutdown"], registry=registry, extra_env={SHUTDOWN_SECONDS_ENV: "3"}
    )
    scenarios.ask_to_shut_down(started)
    time.sleep(0.2)  # inside its ending_cleanly() by now
    scenarios.kill_worker(started)
    time.sleep(0.1)  # its watchdog records that the ending has begun
    return Planted.of(started.runners[0].identity.pid), started


def check(version: str, timeout: float, busy: bool = False) -> dict[str, Any]:
    import anyio

    result: dict[str, Any] = {
        "connect_to_group_forwarded": False,
        "orphan_killed": False,
        "own_runner_alive": False,
        "sweep_before_forward": False,
        "version": version,
    }
    if busy:
        result.update(
            connect_to_group_once=False,
            other_instance_served_while_waiting=False,
            wait_logged=False,
        )
    scenario: Any = None
    logged: list[str] = []
    scratch = Path(tempfile.mkdtemp(prefix="exo-ctg-check-"))
    planted: list[Planted] = []
    try:
        prepare_env(scratch)
        from exo.shared.types.tasks import ConnectToGroup

        report_guard_wiring(note, unpatched="nothing will sweep")
        if busy:
            # Its ending lasts seconds: nothing slow (imports) may come after it starts.
            for module in WARM_UP:
                importlib.import_module(module)
            from loguru import logger

            logger.add(lambda message: logged.append(str(message)), level="INFO")
            orphan, scenario = start_busy_orphan()
        else:
            orphan = start_orphan()
        planted.append(orphan)
        own = start_own_runner()
        planted.append(own)
        import psutil

        note(
            f"orphan pid {orphan.pid} (parent {psutil.Process(orphan.pid).ppid()}), "
            f"own runner pid {own.pid}, worker pid {os.getpid()}"
        )
        if not orphan.alive():
            note("the orphan died before plan_step ran (another sweep?)")
            return result

        started = time.monotonic()
        fake = anyio.run(drive_plan_step, orphan, timeout)
        forwarded = [entry for entry in fake.received if isinstance(entry[0], ConnectToGroup)]
        result["connect_to_group_forwarded"] = bool(forwarded)
        result["orphan_killed"] = not orphan.alive()
        result["own_runner_alive"] = own.alive()
        if forwarded:
            _task, at, orphan_alive = forwarded[0]
            result["sweep_before_forward"] = not orphan_alive
            note(f"ConnectToGroup reached the supervisor {at - started:.2f} s after plan_step")
        if busy:
            from exo.shared.types.tasks import LoadModel

            result["connect_to_group_once"] = len(forwarded) == 1
            loads = [entry for entry in fake.received if isinstance(entry[0], LoadModel)]
            result["other_instance_served_while_waiting"] = bool(loads) and loads[0][2]
            waits = [line for line in logged if f"waiting for runner {orphan.pid} " in line]
            result["wait_logged"] = len(waits) == 1 and " until " in waits[0]
            note(f"logged: {waits}")
            for task, at, alive in fake.received:
                note(f"{type(task).__name__} at {at - started:.2f} s, orphan alive: {alive}")
        return result
    except Exception:  # report all-false (exit 1) rather than no JSON at all
        traceback.print_exc()
        return result
    finally:
        for process in planted:
            try:
                process.kill()
            except Exception as error:
                note(f"cleanup of pid {process.pid} failed: {error!r}")
        if scenario is not None:
            from exo_orphan_guard.rig import scenarios

            scenarios.cleanup(scenario)
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", choices=VERSIONS, required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument(
        "--busy-orphan",
        action="store_true",
        help="the orphan is ending cleanly: the sweep waits for it, plan_step must not",
    )
    args = parser.parse_args()

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through check()'s cleanup

    signal.signal(signal.SIGTERM, stop)
    result = check(args.version, args.timeout, args.busy_orphan)
    print(json.dumps(result), flush=True)
    return 0 if all(value for key, value in result.items() if key != "version") else 1


if __name__ == "__main__":
    sys.exit(main())
