"""Stand-in for exo's worker: runs exo's REAL RunnerSupervisor on a real runner.

Run it with the python of an environment made by ``scripts/exo-venv <tree>
<cache> --runner <mlx-lm-src>`` (exo is imported from that tree)::

    <venv>/bin/python tests/exo_support/worker_harness.py --version main --mode runner

Mode ``runner``: sets up loguru the way exo does (``logger_setup(None)``; the
default logger cannot be pickled into the runner), forces the ``spawn`` start
method (as ``exo/main.py`` does), builds a bound two-node MLX ring instance with
exo's own test fixture ``get_bound_mlx_ring_instance`` (imported from the
tree, with the id types its conftest imports: ``ModelId`` moved twice between
v1.0.61 and main), creates exo's ``RunnerSupervisor`` (async ``create`` in
``supervisor.py`` on main; sync in ``runner_supervisor.py`` from v1.0.61 to
v1.0.71, whose runner is a ``main()`` function up to v1.0.65 and a ``Runner``
class from v1.0.69; ``cancel_receiver`` from v1.0.68) and runs it under anyio.
When the runner reports ``RunnerIdle`` through the event stream the supervisor
forwards, it prints one JSON line::

    {"event": "runner-idle", "worker_pid": ..., "runner_pid": ..., ...}

(``exit_locks`` names the shared semaphores the runner's exit takes: see
``exit_lock_names``.)

and keeps running until killed (with EOG_HARNESS_STALL_ON_SIGUSR2 set, SIGUSR2 makes
it stop reading the runner's events: main only). If the runner fails, dies, or is not idle
within ``--timeout`` seconds, it prints ``{"event": "error", ...}``, lets the
supervisor stop the runner, and exits 1. If the runner dies after being idle it
prints ``{"event": "runner-died", ...}`` and exits 2.

stdout carries only these JSON lines; exo's logs go to stderr.

Environment: exo reads EXO_RESOURCES_DIR / EXO_DASHBOARD_DIR and the XDG_*
dirs at import. Those not set by the caller are pointed into a scratch dir
(``--scratch``, default a new ``/tmp/exo-harness-*``; reported in the JSON as
``scratch``, the caller removes it), so nothing is written under ``~``.

What exo's main process shows: a stand-in of exo's Rust extension mapped
(`node_io.map_exo_extension`; `--exo-main script`, the default: as exo's console
script, whose runners map it too; `module`: as `python -m exo`, whose runners map
nothing of exo's), so that a sweep takes it, and its runner, for what they stand for.

This file deliberately imports nothing from exo_orphan_guard: patched exo code
calls it itself. Nothing here runs at import time but `node_io`'s mapping (spawned
children re-import the main module).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from node_io import map_exo_extension

VERSIONS = ("v1.0.61", "v1.0.65", "v1.0.69", "v1.0.71", "main")


_json_out: Any = None


def private_stdout() -> None:
    """Keep fd 1 for our JSON lines only.

    The JSON goes to a private (non-inheritable) duplicate of fd 1, and fd 1
    itself is pointed at stderr, so nothing else (exo's v1.0.71 runner
    inherits the worker's stdio; stray prints) lands on stdout, and no child
    holds the stdout pipe open after the harness dies.
    """
    global _json_out
    _json_out = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)


def emit(**fields: Any) -> None:
    out = _json_out if _json_out is not None else sys.stdout
    out.write(json.dumps(fields) + "\n")
    out.flush()


def prepare_env(scratch: Path) -> None:
    """Give exo the directories it reads at import, unless the caller did."""
    resources = scratch / "resources"
    dashboard = scratch / "dashboard"
    resources.mkdir(parents=True, exist_ok=True)
    dashboard.mkdir(parents=True, exist_ok=True)
    index = dashboard / "index.html"
    if not index.exists():
        index.write_text("<!doctype html><title>exo test</title>\n")
    defaults = {
        "EXO_RESOURCES_DIR": resources,
        "EXO_DASHBOARD_DIR": dashboard,
        "XDG_CACHE_HOME": scratch / "xdg-cache",
        "XDG_DATA_HOME": scratch / "xdg-data",
        "XDG_CONFIG_HOME": scratch / "xdg-config",
    }
    for name, path in defaults.items():
        os.environ.setdefault(name, str(path))


def resource_tracker_pid() -> int | None:
    try:
        from multiprocessing import resource_tracker

        pid = resource_tracker._resource_tracker._pid  # pyright: ignore[reportAttributeAccessIssue, reportPrivateUsage]
    except Exception:
        return None
    return pid if isinstance(pid, int) else None


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie child counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def exit_lock_names(supervisor: Any) -> dict[str, str]:
    """The shared semaphore behind each of the supervisor's channels' `closed` event's
    lock, by the channel's attribute: the runner's exit takes each (`close()` calls
    `closed.is_set()` in entrypoint's `finally`), and a worker SIGKILLed while holding
    one leaves that exit blocked for good, whatever signal the runner is sent."""
    names: dict[str, str] = {}
    for attribute, value in vars(supervisor).items():
        closed = getattr(getattr(value, "_state", None), "closed", None)
        semlock = getattr(getattr(getattr(closed, "_cond", None), "_lock", None), "_semlock", None)
        name = getattr(semlock, "name", None)
        if isinstance(name, str):
            names[attribute] = name
    return names


STALL_ENV = "EOG_HARNESS_STALL_ON_SIGUSR2"


def stall_events_on_sigusr2(supervisor: Any) -> None:
    """With STALL_ENV set, SIGUSR2 makes this worker stop reading its runner's events
    for good, as a hung worker does (its process, and so every lock it shares with the
    runner, left running): a thread takes the event queue's reader lock and keeps it,
    so exo's supervisor never reads again and the runner's event pipe fills."""
    import threading

    def stall(signum: int, frame: object) -> None:
        lock = supervisor._ev_recv._state.buffer._rlock
        threading.Thread(target=lock.acquire, name="stall-events", daemon=True).start()

    signal.signal(signal.SIGUSR2, stall)


async def run_runner(args: argparse.Namespace, started: float, scratch: Path) -> int:
    import anyio
    from exo.shared.types.events import Event, RunnerStatusUpdated
    from exo.shared.types.worker.runners import RunnerFailed, RunnerIdle
    from exo.utils.channels import channel
    from exo.worker.tests.unittests import conftest

    # The id types as exo's own fixture module has them at this version.
    bound_instance = conftest.get_bound_mlx_ring_instance(
        instance_id=conftest.InstanceId("harness-instance"),
        model_id=conftest.ModelId("mlx-community/Llama-3.2-1B-Instruct-4bit"),
        runner_id=conftest.RunnerId("harness-runner"),
        node_id=conftest.NodeId("harness-node"),
    )
    event_sender, event_receiver = channel[Event]()

    if args.version == "main":
        from exo.worker.runner.supervisor import RunnerSupervisor as MainSupervisor

        supervisor: Any = await MainSupervisor.create(
            bound_instance=bound_instance, event_sender=event_sender
        )
    else:  # v1.0.61 to v1.0.71
        from exo.worker.runner.runner_supervisor import (  # pyright: ignore[reportMissingImports]
            RunnerSupervisor as V1Supervisor,  # pyright: ignore[reportUnknownVariableType]
        )

        supervisor = V1Supervisor.create(  # pyright: ignore[reportUnknownMemberType]
            bound_instance=bound_instance, event_sender=event_sender
        )

    def runner_pid() -> int | None:
        try:
            pid = supervisor.runner_process.pid
        except Exception:  # AsyncProcess.pid raises before the start
            return None
        return pid if isinstance(pid, int) else None

    def base(**extra: Any) -> dict[str, Any]:
        return {
            "exit_locks": exit_lock_names(supervisor),
            "worker_pid": os.getpid(),
            "runner_pid": runner_pid(),
            "resource_tracker_pid": resource_tracker_pid(),
            "version": args.version,
            "elapsed_s": round(time.monotonic() - started, 3),
            "scratch": str(scratch),
            **extra,
        }

    if os.environ.get(STALL_ENV):
        stall_events_on_sigusr2(supervisor)

    outcome: dict[str, Any] = {}

    async def watch_events() -> None:
        async for event in event_receiver:
            if not isinstance(event, RunnerStatusUpdated):
                continue
            status = event.runner_status
            if isinstance(status, RunnerIdle) and "idle" not in outcome:
                outcome["idle"] = True
                emit(event="runner-idle", **base())
            elif isinstance(status, RunnerFailed):
                outcome["failed"] = status.error_message
                return
        outcome.setdefault("failed", "event stream closed")

    async def watch_process() -> None:
        # exo's own watch polls every 5 s; look more often, and report a
        # runner that never starts or goes away.
        while True:
            await anyio.sleep(0.2)
            pid = runner_pid()
            if pid is not None and not pid_alive(pid):
                await anyio.sleep(1)  # let exo's supervisor report first
                outcome.setdefault("failed", "runner process exited")
                return

    fallback_scope = anyio.CancelScope()

    async def run_supervisor() -> None:
        try:
            await supervisor.run()
        finally:
            fallback_scope.cancel()

    async with anyio.create_task_group() as tg:

        async def fallback() -> None:
            # exo's stop path escalates join, terminate, kill within seconds;
            # should it hang, kill the runner ourselves.
            with fallback_scope:
                await anyio.sleep(30)
                pid = runner_pid()
                if pid is not None and pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
                tg.cancel_scope.cancel()

        tg.start_soon(run_supervisor)
        async with anyio.create_task_group() as watchers:

            async def first(fn: Any) -> None:
                await fn()
                watchers.cancel_scope.cancel()

            async def deadline() -> None:
                remaining = args.timeout - (time.monotonic() - started)
                await anyio.sleep(max(remaining, 0))
                if "idle" not in outcome:
                    outcome.setdefault("failed", f"runner not idle within {args.timeout} s")
                    watchers.cancel_scope.cancel()

            watchers.start_soon(first, watch_events)
            watchers.start_soon(first, watch_process)
            watchers.start_soon(deadline)

        # Only reached on failure: idle runs stay in the watchers forever.
        if "idle" in outcome:
            emit(event="runner-died", error=outcome.get("failed"), **base())
            code = 2
        else:
            emit(event="error", error=outcome.get("failed"), **base())
            code = 1
        supervisor.shutdown()  # exo's own stop path: join, terminate, kill
        tg.start_soon(fallback)
    return code


def main() -> NoReturn:
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", choices=VERSIONS, required=True)
    parser.add_argument("--mode", choices=("runner",), default="runner")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--scratch", type=Path, default=None)
    parser.add_argument("--exo-main", choices=("script", "module"), default="script")
    args = parser.parse_args()

    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="exo-harness-"))
    scratch = scratch.resolve()
    prepare_env(scratch)
    map_exo_extension(scratch, runners=args.exo_main == "script")
    private_stdout()

    mp.set_start_method("spawn", force=True)
    code = 1
    try:
        import anyio
        from exo.shared.logging import logger_setup

        logger_setup(None)
        code = anyio.run(run_runner, args, started, scratch)
    except BaseException as e:  # report anything, then fail
        if isinstance(e, SystemExit):
            raise
        emit(
            event="error",
            error=f"{type(e).__name__}: {e}",
            worker_pid=os.getpid(),
            runner_pid=None,
            version=args.version,
            elapsed_s=round(time.monotonic() - started, 3),
            scratch=str(scratch),
        )
        code = 1
    finally:
        try:
            from loguru import logger

            logger.complete()  # flush the enqueue=True sinks
        except Exception:
            pass
    sys.exit(code)


if __name__ == "__main__":
    main()
