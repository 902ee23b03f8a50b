"""Does exo's REAL ``Worker`` drop a ConnectToGroup whose runner was shut down, or
replaced, while the sweep before it waited, and run on?

Run it like ``connect_to_group_check.py`` (whose fake supervisor and busy orphan it
uses), with the python of a ``scripts/exo-venv`` environment for a patched tree::

    <venv>/bin/python tests/exo_support/runner_gone_check.py --version main --runner shut-down
    <venv>/bin/python tests/exo_support/runner_gone_check.py --version v1.0.71 --runner replaced

What it does: exo's real ``plan()`` asks for ConnectToGroup (a two-node ring instance,
this node rank 0, as in ``connect_to_group_check.py``), and the sweep before it waits
for a leftover runner that is ending cleanly (3 s). While it waits, the peer runner
turns ``RunnerFailed`` (the RDMA failure case), so exo's real ``plan()`` asks for
``Shutdown`` of this node's runner and ``plan_step`` pops it from ``worker.runners``
(exo's own kill path, not filtered by the waiting ConnectToGroup). With ``--runner
replaced`` a new supervisor then takes its place under the same runner id, as
``_create_supervisor`` would put it there, and the peer is idle again. Beside
``plan_step``, a heartbeat task stands for the worker's other tasks (info gatherer,
event applier, API, elections); every call of ``plan()`` is counted.

Prints ONE JSON line on stdout and exits 0 when every key but ``version`` and
``task_group_error`` is true:

- ``shut_down_during_sweep``: the runner got exo's Shutdown while the sweep waited;
- ``no_task_group_error``: the worker's task group ended only by this script's
  cancel (the earlier series: ``KeyError`` from ``_start_runner_task``, which ends
  the task group and cancels its siblings; ``task_group_error`` names it);
- ``stale_connect_to_group_dropped``: the ConnectToGroup planned before the shutdown
  reached no supervisor (neither the old one nor its replacement);
- ``drop_logged``: exactly one log line says so (``dropped``, with the instance id);
- ``worker_ran_on``: after the sweep ended, ``plan()`` was called and the heartbeat
  ticked again and again for another second;
- with ``--runner replaced``, ``new_runner_connected_once``: the replacement got one
  ConnectToGroup, planned after it took its place.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True
from check_setup import Planted, prepare_env, report_guard_wiring  # noqa: E402
from connect_to_group_check import (  # noqa: E402
    VERSIONS,
    WARM_UP,
    FakeSupervisor,
    other_instance,
    ring_worker,
    start_busy_orphan,
)

PEER = "other_runner"
"""The other rank of exo's `get_bound_mlx_ring_instance`."""
WATCH_AFTER_SWEEP = 1.0


def note(message: str) -> None:
    print(f"runner_gone_check: {message}", file=sys.stderr, flush=True)


def failed_status() -> Any:
    from exo.shared.types.worker.runners import RunnerFailed

    error = "[jaccl] Changing queue pair to RTR failed with errno 16"
    if "diagnostics" in RunnerFailed.model_fields:  # exo main
        return RunnerFailed(error_message=error, diagnostics=[])
    return RunnerFailed(error_message=error)


async def until(condition: Any, timeout: float, what: str) -> None:
    import anyio

    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)
    note(what)


async def drive(orphan: Planted, replace: bool, timeout: float) -> dict[str, Any]:
    import anyio
    import exo.worker.main as worker_main
    from exo.shared.types.tasks import ConnectToGroup, Shutdown
    from exo.shared.types.worker.runners import RunnerId, RunnerIdle

    worker, bound, receivers = ring_worker()
    instance = bound.instance
    assert RunnerId(PEER) in instance.shard_assignments.runner_to_shard
    old = FakeSupervisor(bound_instance=bound, status=RunnerIdle(), orphan=orphan)
    worker.runners[bound.bound_runner_id] = old  # pyright: ignore[reportArgumentType]
    other = other_instance(worker, orphan)
    new: FakeSupervisor | None = None

    planned: list[tuple[Any, float]] = []  # (task, when) for every task plan() returned
    plan_calls: list[float] = []
    ticks: list[float] = []
    real_plan = worker_main.plan

    def counting_plan(*args: Any, **kwargs: Any) -> Any:
        plan_calls.append(time.monotonic())
        task = real_plan(*args, **kwargs)
        if task is not None:
            planned.append((task, time.monotonic()))
        return task

    worker_main.plan = counting_plan  # plan_step calls it by this module's name

    async def heartbeat() -> None:
        while True:
            ticks.append(time.monotonic())
            await anyio.sleep(0.1)

    def waiting() -> frozenset[Any]:
        return worker._sweeps_before_connecting.waiting  # pyright: ignore[reportPrivateUsage]

    def set_peer(status: Any) -> None:
        worker.state = worker.state.model_copy(
            update={"runners": {**worker.state.runners, RunnerId(PEER): status}}
        )

    def shutdown_reached_old() -> bool:
        return any(isinstance(task, Shutdown) for task, _at, _alive in old.received)

    facts: dict[str, Any] = {"task_group_error": None}
    replaced_at = sweep_over_at = None
    try:
        with anyio.fail_after(timeout):
            async with worker._tg as tg:  # pyright: ignore[reportPrivateUsage]
                tg.start_soon(worker.plan_step)
                tg.start_soon(heartbeat)
                await until(
                    lambda: instance.instance_id in waiting(),
                    timeout,
                    "ConnectToGroup planned; its sweep waits",
                )
                set_peer(failed_status())
                await until(shutdown_reached_old, timeout, "Shutdown reached the runner")
                facts["shut_down_during_sweep"] = (
                    instance.instance_id in waiting() and orphan.alive()
                )
                if replace:
                    # As _create_supervisor would: a new supervisor, the same runner id.
                    new = FakeSupervisor(bound_instance=bound, status=RunnerIdle(), orphan=orphan)
                    new.got_connect_to_group = anyio.Event()
                    worker.runners[bound.bound_runner_id] = new  # pyright: ignore[reportArgumentType]
                    set_peer(RunnerIdle())
                    replaced_at = time.monotonic()
                await until(
                    lambda: instance.instance_id not in waiting(), timeout, "the sweep is over"
                )
                sweep_over_at = time.monotonic()
                if new is not None:
                    await new.got_connect_to_group.wait()
                await anyio.sleep(WATCH_AFTER_SWEEP)
                tg.cancel_scope.cancel()
    except Exception as error:  # what ended the task group is the finding
        facts["task_group_error"] = repr(error)
        note(f"the worker's task group ended with {error!r}")
        traceback.print_exc()
    finally:
        worker_main.plan = real_plan
        for receiver in receivers:
            receiver.close()

    connects = [task for task, _at in planned if isinstance(task, ConnectToGroup)]
    stale = connects[0] if connects else None
    reached = [
        (name, task)
        for name, fake in (("old", old), ("new", new), ("other", other))
        if fake is not None
        for task, _at, _alive in fake.received
        if isinstance(task, ConnectToGroup)
    ]
    for name, task in reached:
        note(f"ConnectToGroup {task.task_id} reached the {name} supervisor")
    facts["no_task_group_error"] = facts["task_group_error"] is None
    facts["stale_connect_to_group_dropped"] = stale is not None and all(
        task.task_id != stale.task_id for _name, task in reached
    )
    if sweep_over_at is not None:
        facts["worker_ran_on"] = (
            sum(at > sweep_over_at for at in plan_calls) >= 3
            and sum(at > sweep_over_at for at in ticks) >= 3
        )
    if replace:
        fresh = [
            task
            for task, at in planned
            if isinstance(task, ConnectToGroup) and replaced_at is not None and at > replaced_at
        ]
        got = [task for name, task in reached if name == "new"]
        facts["new_runner_connected_once"] = (
            len(got) == 1 and bool(fresh) and got[0].task_id == fresh[0].task_id
        )
    return facts


def check(version: str, replace: bool, timeout: float) -> dict[str, Any]:
    import anyio

    result: dict[str, Any] = {
        "shut_down_during_sweep": False,
        "no_task_group_error": False,
        "stale_connect_to_group_dropped": False,
        "drop_logged": False,
        "worker_ran_on": False,
        "task_group_error": None,
        "version": version,
    }
    if replace:
        result["new_runner_connected_once"] = False
    logged: list[str] = []
    scenario: Any = None
    orphan: Planted | None = None
    scratch = Path(tempfile.mkdtemp(prefix="exo-runner-gone-check-"))
    try:
        prepare_env(scratch)
        report_guard_wiring(note, unpatched="nothing will sweep")
        for module in WARM_UP:
            importlib.import_module(module)
        from exo.shared.types.worker.instances import InstanceId
        from exo.worker.tests.constants import INSTANCE_1_ID
        from loguru import logger

        logger.add(lambda message: logged.append(str(message)), level="INFO")
        orphan, scenario = start_busy_orphan()
        result.update(anyio.run(drive, orphan, replace, timeout))
        instance_id = str(InstanceId(INSTANCE_1_ID))
        drops = [
            line
            for line in logged
            if "ConnectToGroup" in line and "dropped" in line and instance_id in line
        ]
        note(f"drop lines: {drops}")
        result["drop_logged"] = len(drops) == 1
        return result
    except Exception:  # report what was found (exit 1) rather than no JSON at all
        traceback.print_exc()
        return result
    finally:
        if orphan is not None:
            orphan.kill()
        if scenario is not None:
            from exo_orphan_guard.rig import scenarios

            scenarios.cleanup(scenario)
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", choices=VERSIONS, required=True)
    parser.add_argument("--runner", choices=("shut-down", "replaced"), required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through check()'s cleanup

    signal.signal(signal.SIGTERM, stop)
    result = check(args.version, args.runner == "replaced", args.timeout)
    print(json.dumps(result), flush=True)
    ignored = ("version", "task_group_error")
    return 0 if all(value for key, value in result.items() if key not in ignored) else 1


if __name__ == "__main__":
    sys.exit(main())
