"""An exo node of two REAL exo Workers forming a ring group, for tests/test_exo_ring_orphan.py.

Run it with the python of an exo venv (``scripts/exo-venv``), from the exo tree::

    <venv>/bin/python tests/exo_support/ring_node.py --mode second --ports P0,P1 --scratch D

It imports nothing of exo_orphan_guard: whatever of the guard runs is what the tree's
own ``Worker.plan_step`` calls (its first lines: the local series' ``await
guard_worker()``, the PR's ``await end_leftover_runners()``).

Two of exo's real ``exo.worker.main.Worker`` objects run in this one process, node
ids ``node-rank0`` and ``node-rank1``, each with its ``run`` and ``plan_step``
unchanged: exo's own ``plan()`` makes their runners (``CreateRunner``) and hands them
``ConnectToGroup``, through exo's real ``RunnerSupervisor``. Their one instance is an
``MlxRingInstance`` of two ranks over loopback, rank 0 on node-rank0 and rank 1 on
node-rank1, on the ports the caller passes (so that a later node can use the same).
Two Workers share a process here where exo runs one per machine: what a Worker keeps
(state, runners, task group) is its own, and the series' start-up sweep runs once per
process (a second caller waits for the first one's), which is what each Worker of two
separate nodes would wait for on one machine.

In place of exo's master and its event router, a stand-in (``Master``) indexes every
event the workers send and hands it, as ``IndexedEvent``, to both workers' event
receivers. It first seeds the log with the instance (``InstanceCreated``) and a
``DownloadCompleted`` of its model for both nodes, so that ``plan()`` skips the
download. It keeps back from the workers every ``RunnerConnected`` (it only reports
them): with the group formed, ``plan()`` would hand the runners ``LoadModel`` next,
and there is no model here. Two other things differ from exo's node: its
``InfoGatherer`` is a stand-in that only waits (on Linux the real one starts
``ip``-style subprocesses; it only feeds the master), and the node's signal handling
is exo's ``Node`` (SIGINT and SIGTERM cancel its task group; a second one exits).

Modes: ``first``: only node-rank0's Worker, and the master also seeds rank 1's runner
as ``RunnerIdle``, so that ``plan()`` hands rank 0 ``ConnectToGroup``: it enters ring
init and sticks there, waiting for a rank 1 that never comes. ``second``: both
Workers, both ranks on the same ports.

Timing: ``Worker.plan_step`` is wrapped to say when each Worker's plan step began,
and ``exo.worker.main.plan`` when it was first called: the plan loop waited for the
sweeps in between, calling the same functions; a ticker on the node's event loop (a
10 ms sleep, again and again) measures how late the loop serves it.

stdout carries JSON lines only (``at``: ``time.monotonic()``, system-wide on Linux):
``node`` (this pid, whether ``exo_orphan_guard`` can be imported here), ``sweep``
(per Worker: ``began``, ``ended``, and the ticker's lateness over that window,
``late_max`` and ``late_p99`` in seconds, ``ticks``), ``runner`` (a runner's pid,
once its supervisor has started it), ``status`` (each ``RunnerStatusUpdated`` a
runner sent), ``formed`` (both ranks sent ``RunnerConnected``; with the ticker's
lateness since the node's start).
"""

from __future__ import annotations

import argparse
import contextvars
import importlib.util
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from node_io import emit, map_exo_extension, prepare_env, private_stdout

TICK = 0.01


class Ticker:
    """How late the event loop serves a task that only sleeps `TICK`, again and again."""

    def __init__(self) -> None:
        self.ticks: list[tuple[float, float]] = []
        """(when it woke, how late), monotonic seconds."""

    async def run(self) -> None:
        import anyio

        while True:
            began = time.monotonic()
            await anyio.sleep(TICK)
            woke = time.monotonic()
            self.ticks.append((woke, max(0.0, woke - began - TICK)))

    def lateness(self, since: float, until: float) -> dict[str, Any]:
        # A tick that began inside the window and woke after it was late inside it.
        late = sorted(late for woke, late in self.ticks if since <= woke - late - TICK <= until)
        if not late:
            return {"ticks": 0, "late_max": None, "late_p99": None}
        p99 = late[min(len(late) - 1, int(0.99 * len(late)))]
        return {"ticks": len(late), "late_max": late[-1], "late_p99": p99}


async def run_node(args: argparse.Namespace) -> None:
    import anyio
    import exo.worker.main as worker_main
    from exo.shared.types.common import Host, NodeId
    from exo.shared.types.events import (
        Event,
        IndexedEvent,
        InstanceCreated,
        NodeDownloadProgress,
        RunnerStatusUpdated,
    )
    from exo.shared.types.memory import Memory
    from exo.shared.types.worker.downloads import DownloadCompleted
    from exo.shared.types.worker.instances import MlxRingInstance
    from exo.shared.types.worker.runners import RunnerConnected, RunnerId, RunnerIdle
    from exo.utils.channels import Sender, channel
    from exo.utils.task_group import TaskGroup
    from exo.worker.tests.unittests import conftest

    class QuietInfoGatherer:
        def __init__(self, *_: object) -> None: ...

        async def run(self) -> None:
            await anyio.sleep_forever()

    worker_main.InfoGatherer = QuietInfoGatherer  # pyright: ignore

    ticker = Ticker()
    # Which Worker plans: its plan_step runs in a task its run() starts, which
    # inherits run_worker's context.
    node_of: contextvars.ContextVar[str] = contextvars.ContextVar("node", default="?")
    began_at: dict[str, float] = {}
    real_plan_step = worker_main.Worker.plan_step
    real_plan = worker_main.plan

    async def timed_plan_step(self: Any) -> None:
        began_at[node_of.get()] = time.monotonic()
        await real_plan_step(self)

    def timed_plan(*args: Any, **kwargs: Any) -> Any:
        # The first plan(): the sweeps before the loop are over.
        node = node_of.get()
        if node in began_at:
            began, ended = began_at.pop(node), time.monotonic()
            emit(
                event="sweep", node=node, began=began, ended=ended, **ticker.lateness(began, ended)
            )
        return real_plan(*args, **kwargs)

    worker_main.Worker.plan_step = timed_plan_step  # pyright: ignore
    worker_main.plan = timed_plan  # pyright: ignore

    ranks = (0, 1)
    node_ids = {rank: NodeId(f"node-rank{rank}") for rank in ranks}
    runner_ids = {rank: RunnerId(f"runner-rank{rank}") for rank in ranks}
    role_of = {str(runner_ids[rank]): f"rank{rank}" for rank in ranks}
    model_id = conftest.ModelId("mlx-community/Llama-3.2-1B-Instruct-4bit")
    shards = {
        rank: conftest.get_pipeline_shard_metadata(
            model_id=model_id, device_rank=rank, world_size=2
        )
        for rank in ranks
    }
    hosts = [Host(ip="127.0.0.1", port=port) for port in args.ports]
    instance = MlxRingInstance(
        instance_id=conftest.InstanceId("ring-orphan-group"),
        shard_assignments=conftest.get_shard_assignments(
            model_id,
            {node_ids[rank]: runner_ids[rank] for rank in ranks},
            {runner_ids[rank]: shards[rank] for rank in ranks},
        ),
        hosts_by_node={node_ids[rank]: hosts for rank in ranks},
        ephemeral_port=hosts[0].port,
    )
    seed: list[Event] = [InstanceCreated(instance=instance)]
    for rank in ranks:
        seed.append(
            NodeDownloadProgress(
                download_progress=DownloadCompleted(
                    node_id=node_ids[rank],
                    shard_metadata=shards[rank],
                    total=Memory.from_mb(1),
                )
            )
        )
    local = ranks if args.mode == "second" else (0,)
    if args.mode == "first":  # rank 1's node, as the master would have it: idle
        seed.append(RunnerStatusUpdated(runner_id=runner_ids[1], runner_status=RunnerIdle()))

    events, from_workers = channel[Event]()
    receivers: list[Sender[IndexedEvent]] = []
    workers: dict[int, Any] = {}
    for rank in local:
        to_worker, worker_events = channel[IndexedEvent]()
        receivers.append(to_worker)
        commands, _commands = channel[Any]()
        downloads, _downloads = channel[Any]()
        workers[rank] = worker_main.Worker(
            node_ids[rank],
            event_receiver=worker_events,
            event_sender=events.clone(),
            command_sender=commands,
            download_command_sender=downloads,
            api_port=52415,
        )
    events.close()  # each worker holds a clone

    class Master:
        """Indexes the workers' events and hands every one to every worker."""

        def __init__(self) -> None:
            self.idx = 0
            self.connected: set[str] = set()

        async def index(self, event: Event) -> None:
            for receiver in receivers:
                await receiver.send(IndexedEvent(idx=self.idx, event=event))
            self.idx += 1

        async def run(self) -> None:
            for event in seed:
                await self.index(event)
            with from_workers as stream:
                async for event in stream:
                    if isinstance(event, RunnerStatusUpdated):
                        role = role_of.get(str(event.runner_id))
                        status = type(event.runner_status).__name__
                        emit(event="status", role=role, status=status)
                        if isinstance(event.runner_status, RunnerConnected):
                            self.connected.add(str(role))
                            if self.connected >= {"rank0", "rank1"}:
                                now = time.monotonic()
                                emit(event="formed", **ticker.lateness(0.0, now))
                            continue  # kept back: plan() would load a model next
                    await self.index(event)

    async def watch_runners() -> None:
        """Each runner's pid, once its supervisor has started its process."""
        seen: set[int] = set()
        while True:
            for rank, worker in workers.items():
                supervisor = worker.runners.get(runner_ids[rank])
                if rank not in seen and supervisor is not None:
                    pid = _pid(supervisor)
                    if pid is not None:
                        seen.add(rank)
                        emit(event="runner", role=f"rank{rank}", pid=pid)
            await anyio.sleep(0.01)

    async def run_worker(rank: int) -> None:
        node_of.set(f"rank{rank}")
        await workers[rank].run()

    class Node:  # exo's Node.run and Node.shutdown (src/exo/main.py)
        def __init__(self) -> None:
            self._tg = TaskGroup()

        async def run(self) -> None:
            async with self._tg as tg:
                signal.signal(signal.SIGINT, lambda _, __: self.shutdown())
                signal.signal(signal.SIGTERM, lambda _, __: self.shutdown())
                tg.start_soon(ticker.run)
                tg.start_soon(Master().run)
                tg.start_soon(watch_runners)
                for rank in local:
                    tg.start_soon(run_worker, rank)

        def shutdown(self) -> None:
            if self._tg.cancel_called():
                sys.exit(1)
            self._tg.cancel_tasks()

    emit(
        event="node",
        pid=os.getpid(),
        mode=args.mode,
        package=importlib.util.find_spec("exo_orphan_guard") is not None,
    )
    await Node().run()


def _pid(supervisor: Any) -> int | None:
    try:
        pid = supervisor.runner_process.pid
    except Exception:  # main's AsyncProcess raises before the start
        return None
    return pid if isinstance(pid, int) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("first", "second"), required=True)
    parser.add_argument(
        "--ports", type=lambda text: [int(port) for port in text.split(",")], required=True
    )
    parser.add_argument("--scratch", type=Path, required=True)
    args = parser.parse_args()
    prepare_env(args.scratch)
    map_exo_extension(args.scratch)  # exo's main module imports exo's extension
    private_stdout()

    import anyio
    from exo.shared.logging import logger_cleanup, logger_setup

    mp.set_start_method("spawn", force=True)
    logger_setup(None)
    try:
        anyio.run(run_node, args)
    finally:
        logger_cleanup()


if __name__ == "__main__":
    sys.exit(main())
