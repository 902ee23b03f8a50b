"""exo's main process, as EXO.app and a terminal stop it, around exo's REAL worker.

Run it with the python of an exo venv (``scripts/exo-venv``), from the exo tree::

    <venv>/bin/python tests/exo_support/app_quit_node.py --version main --busy eval

exo's full ``main`` needs its Rust bindings (router, election, pidfile), which are
not built here. What it does on SIGINT and SIGTERM is kept as exo has it
(``src/exo/main.py``, the same at main and v1.0.71):

- ``main_inner``: ``mp.set_start_method("spawn", force=True)``, ``logger_setup``
  (to stderr: no log file), ``anyio.run(node.run)``, on any exception a critical log
  line and re-raise, ``logger_cleanup()`` in ``finally``; then the interpreter's
  exit (multiprocessing's atexit terminates daemonic children and joins them);
- ``Node``: exo's own ``TaskGroup`` (``exo.utils.task_group``); ``run`` installs
  ``signal.signal(SIGINT/SIGTERM, lambda _, __: self.shutdown())`` inside it and
  starts the Worker's ``run``; ``shutdown`` cancels the task group, and a second
  call does ``sys.exit(1)`` (exo's lines, with one JSON line added before them);
- the Worker is exo's REAL ``exo.worker.main.Worker`` from the tree (patched or
  not), its ``run`` unchanged; its ``plan_step`` begins with the series' ``await
  guard_worker()`` where the tree has the module, as the patched one does. Two
  things differ: its ``InfoGatherer`` is a stand-in that only waits (on Linux the
  real one starts ``ip``-style subprocesses; it feeds the master and plays no part in
  stopping runners), and its ``plan_step`` makes the runners exo's way
  (``_create_supervisor(CreateRunner(...))``, the real ``RunnerSupervisor``) instead
  of asking ``plan()``, which with no master would shut them down.

Runners: ``idle`` and ``busy``, ranks 0 and 1 of one two-node MLX ring instance over
loopback, so that each has taken its first task: exo's ``ConnectToGroup``, handed over
by the supervisor's own ``start_task`` (as ``Worker.plan_step`` does), after which the
two form a real ring group. ``busy`` is spawned with ``EOG_STEPS_MODE`` set and
``EOG_STEPS_SKIP_GETS=1``, so ``steps_site`` puts it, at its next wait for a task,
in one long ``mx.eval`` (``eval``), exo main's own decode loop (``decode``) or a
native call that holds the GIL with every signal blocked (``gil``: wedged).
``steps_site`` must be on PYTHONPATH and ``EOG_STEPS_NOTES`` set for that.

exo's own ``Shutdown`` (an instance the master deleted): once the file
``<scratch>/delete-instance`` appears, ``plan_step`` runs the lines of exo's
``case Shutdown(runner_id=...)`` for each runner, idle first: the supervisor popped,
``start_task(Shutdown)`` within ``fail_after(3)``, then ``runner.shutdown()``.

stdout carries JSON lines only (times are ``time.monotonic()``, system-wide here):
``ready`` (pids, once both runners have taken ``ConnectToGroup`` and the idle one is
connected; ``package``: whether ``exo_orphan_guard`` can be imported here),
``deleting`` (exo's Shutdown begins), ``shutdown`` (each signal exo's handler
took), ``runner-ended`` (when exo's process reaps the runner: ``code`` is ``exited`` or
``killed``, ``status`` the exit status or signal), ``exiting`` (``anyio.run`` returned or raised).
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from node_io import emit, map_exo_extension, prepare_env, private_stdout


def report_reaping(roles: dict[int, str]) -> None:
    """Say how each runner ended, when exo's process reaps it (multiprocessing's
    `Popen.poll` and `wait` call `os.waitpid`): the same call, its result passed on."""
    real = os.waitpid

    def waitpid(pid: int, options: int, /) -> tuple[int, int]:
        reaped, status = real(pid, options)
        if reaped in roles:
            if os.WIFSIGNALED(status):
                code, value = "killed", os.WTERMSIG(status)
            else:
                code, value = "exited", os.WEXITSTATUS(status)
            emit(event="runner-ended", role=roles[reaped], pid=reaped, code=code, status=value)
        return reaped, status

    os.waitpid = waitpid


async def run_node(args: argparse.Namespace) -> None:
    import anyio
    import exo.worker.main as worker_main
    from exo.shared.types.common import Host, NodeId
    from exo.shared.types.events import Event, IndexedEvent, RunnerStatusUpdated
    from exo.shared.types.tasks import ConnectToGroup, CreateRunner, Shutdown
    from exo.shared.types.worker.instances import BoundInstance, MlxRingInstance
    from exo.shared.types.worker.runners import RunnerConnected, RunnerFailed, RunnerId
    from exo.utils.channels import channel
    from exo.utils.task_group import TaskGroup
    from exo.worker.tests.unittests import conftest

    class QuietInfoGatherer:
        def __init__(self, *_: object) -> None: ...

        async def run(self) -> None:
            await anyio.sleep_forever()

    worker_main.InfoGatherer = QuietInfoGatherer  # pyright: ignore

    roles = ["busy", "idle"]
    node_id = NodeId("app-quit-node")
    other_id = NodeId("other_node")
    model_id = conftest.ModelId("mlx-community/Llama-3.2-1B-Instruct-4bit")
    runner_ids = {"idle": RunnerId("runner-idle"), "busy": RunnerId("runner-busy")}
    ranks = {"idle": 0, "busy": 1}
    nodes = {"idle": node_id, "busy": other_id}
    hosts = [Host(ip="127.0.0.1", port=port) for port in _free_ports(2)]
    instance = MlxRingInstance(
        instance_id=conftest.InstanceId("app-quit-group"),
        shard_assignments=conftest.get_shard_assignments(
            model_id,
            {nodes[role]: runner_ids[role] for role in roles},
            {
                runner_ids[role]: conftest.get_pipeline_shard_metadata(
                    model_id=model_id, device_rank=ranks[role], world_size=2
                )
                for role in roles
            },
        ),
        hosts_by_node={node_id: hosts, other_id: hosts},
        ephemeral_port=hosts[0].port,
    )
    bound = {
        role: BoundInstance(
            instance=instance, bound_runner_id=runner_ids[role], bound_node_id=nodes[role]
        )
        for role in roles
    }
    pids: dict[str, int] = {}
    reaped_roles: dict[int, str] = {}
    report_reaping(reaped_roles)
    connected: set[str] = set()
    taken: set[str] = set()
    role_of = {str(b.bound_runner_id): role for role, b in bound.items()}
    delete_file = args.scratch / "delete-instance"

    def maybe_ready() -> None:
        # A wedged runner may hold the GIL before its feeder thread has sent
        # RunnerConnected: the caller waits for its note instead.
        wanted = {"idle"} if args.busy == "gil" else set(roles)
        if taken >= set(roles) and connected >= wanted:
            emit(
                event="ready",
                worker_pid=os.getpid(),
                pids=pids,
                package=importlib.util.find_spec("exo_orphan_guard") is not None,
            )

    class Worker(worker_main.Worker):
        async def plan_step(self) -> None:  # exo's CreateRunner, without plan()
            # The series' first lines in exo's plan_step, which this override replaces:
            # the local series' (where it is in) and the PR's.
            try:
                from exo.worker.orphan_guard import guard_worker  # pyright: ignore
            except ImportError:  # a pristine tree, or the PR alone
                pass
            else:
                await guard_worker()  # pyright: ignore
            try:
                from exo.worker.runner.leftover_runners import (  # pyright: ignore
                    end_leftover_runners,  # pyright: ignore
                )
            except ImportError:  # a pristine tree
                pass
            else:
                await end_leftover_runners()  # pyright: ignore
            supervisors: dict[str, Any] = {}
            for role in roles:
                if role == "busy":
                    os.environ["EOG_STEPS_MODE"] = args.busy
                    os.environ["EOG_STEPS_SKIP_GETS"] = "1"
                task = CreateRunner(instance_id=instance.instance_id, bound_instance=bound[role])
                made: Any = self._create_supervisor(task)
                supervisor: Any = await made if args.version == "main" else made
                while (pid := _pid(supervisor)) is None:
                    await anyio.sleep(0.01)
                os.environ.pop("EOG_STEPS_MODE", None)
                os.environ.pop("EOG_STEPS_SKIP_GETS", None)
                pids[role] = pid
                reaped_roles[pid] = role
                supervisors[role] = supervisor

            async def first_task(role: str) -> None:
                # The first task, as Worker._start_runner_task hands it over.
                await supervisors[role].start_task(ConnectToGroup(instance_id=instance.instance_id))
                taken.add(role)
                maybe_ready()

            async with anyio.create_task_group() as group:
                for role in roles:
                    group.start_soon(first_task, role)
            while not delete_file.exists():
                await anyio.sleep(0.02)
            emit(event="deleting")
            for role in ("idle", "busy"):  # exo's `case Shutdown(runner_id=runner_id)`
                task = Shutdown(instance_id=instance.instance_id, runner_id=runner_ids[role])
                runner = self.runners.pop(runner_ids[role])
                try:
                    with anyio.fail_after(3):
                        await runner.start_task(task)
                except TimeoutError:
                    emit(event="shutdown-timed-out", role=role)
                finally:
                    runner.shutdown()
            await anyio.sleep_forever()

    to_worker, worker_events = channel[IndexedEvent]()
    events, from_worker = channel[Event]()
    commands, _commands = channel[Any]()
    downloads, _downloads = channel[Any]()
    worker = Worker(
        node_id,
        event_receiver=worker_events,
        event_sender=events,
        command_sender=commands,
        download_command_sender=downloads,
        api_port=52415,
    )

    class Node:  # exo's Node.run and Node.shutdown (src/exo/main.py)
        def __init__(self) -> None:
            self._tg = TaskGroup()

        async def run(self) -> None:
            async with self._tg as tg:
                signal.signal(signal.SIGINT, lambda _, __: self.shutdown())
                signal.signal(signal.SIGTERM, lambda _, __: self.shutdown())
                tg.start_soon(worker.run)
                tg.start_soon(self._events)

        def shutdown(self) -> None:
            emit(event="shutdown", second=self._tg.cancel_called())
            # if this is our second call to shutdown, just sys.exit
            if self._tg.cancel_called():
                import sys

                sys.exit(1)
            self._tg.cancel_tasks()

        async def _events(self) -> None:  # exo's EventRouter reads the worker's events
            with from_worker as stream, to_worker:
                async for event in stream:
                    if not isinstance(event, RunnerStatusUpdated):
                        continue
                    role = role_of.get(str(event.runner_id))
                    if isinstance(event.runner_status, RunnerFailed):
                        emit(
                            event="runner-failed",
                            role=role,
                            error=event.runner_status.error_message,
                        )
                    elif isinstance(event.runner_status, RunnerConnected) and role is not None:
                        connected.add(role)
                        maybe_ready()

    await Node().run()


def _free_ports(count: int) -> list[int]:
    """Ports the kernel has just handed out, for the two ranks' ring listeners."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pid(supervisor: Any) -> int | None:
    try:
        pid = supervisor.runner_process.pid
    except Exception:  # main's AsyncProcess raises before the start
        return None
    return pid if isinstance(pid, int) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", choices=("main", "v1.0.71"), required=True)
    parser.add_argument("--busy", choices=("eval", "decode", "gil"), default="eval")
    parser.add_argument("--scratch", type=Path, required=True)
    args = parser.parse_args()
    prepare_env(args.scratch)
    map_exo_extension(args.scratch)  # exo's main module imports exo's extension
    private_stdout()

    import anyio
    from exo.shared.logging import logger_cleanup, logger_setup
    from loguru import logger

    mp.set_start_method("spawn", force=True)
    logger_setup(None)
    try:
        anyio.run(run_node, args)
    except BaseException as exception:
        emit(event="exiting", how=type(exception).__name__)
        logger.opt(exception=exception).critical("EXO terminated due to unhandled exception")
        raise
    else:
        emit(event="exiting", how="returned")
    finally:
        logger.info("EXO Shutdown complete")
        logger_cleanup()


if __name__ == "__main__":
    sys.exit(main())
