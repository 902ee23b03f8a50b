"""A stand-in for exo's worker and runners, for the self-test, the demo and the tests.

The worker spawns runners the way exo does (multiprocessing spawn context,
`daemon=True`, `prepare_worker()` first, `guard_runner()` at the top of the runner),
prints one JSON line describing them once they are armed, then waits to be killed.

    python -m exo_orphan_guard.rig.scenario_worker '<WorkerSpec JSON>'
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Literal, TypedDict, cast

RunnerKind = Literal["idle", "gil", "child", "late", "deaf", "talk"]
"""idle: sleeps in Python. gil: holds the GIL in native code. child: has a child of
its own. late: guarded only after its worker died. deaf: ignores SIGTERM and holds
the GIL, as a runner stuck in MLX init would. talk: writes a line to its inherited
stdout every 50 ms, as v1.0.71's runners log to the worker's terminal."""
Watch = Literal["guard", "pr2205", "none"]
SpawnFrom = Literal["main", "thread"]

PR2205_POLL_SECONDS = 5.0
_READY_TIMEOUT_SECONDS = 30.0


class RunnerReport(TypedDict):
    pid: int
    children: list[int]


class WorkerReport(TypedDict):
    worker: int
    runners: list[RunnerReport]


class WorkerSpec(TypedDict):
    runners: list[RunnerKind]
    watch: Watch
    spawn_from: SpawnFrom
    go_file: str
    """For `late` runners: they call guard_runner() only once this file exists."""


def runner_main(
    kind: RunnerKind, watch: Watch, go_file: str, report: multiprocessing.connection.Connection
) -> None:
    if kind == "late":
        _report(report, RunnerReport(pid=os.getpid(), children=[]))
        while not os.path.exists(go_file):
            time.sleep(0.005)
    _start_watch(watch)
    children: list[int] = []
    if kind == "child":
        children.append(subprocess.Popen(["/bin/sleep", "3600"]).pid)
    if kind != "late":
        # Connection.send writes synchronously: it is out before the GIL is taken.
        _report(report, RunnerReport(pid=os.getpid(), children=children))
    if kind == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if kind in ("gil", "deaf"):
        # Holds the GIL for the whole sleep, like mx.distributed.init() does.
        ctypes.PyDLL(None).sleep(3600)
    while kind == "talk":
        print(f"runner {os.getpid()} tick {time.monotonic():.3f}", flush=True)
        time.sleep(0.05)
    while True:
        time.sleep(3600)


def _report(connection: multiprocessing.connection.Connection, report: RunnerReport) -> None:
    """Like exo's runners, live on when the worker is gone: an orphan, not a crash."""
    with contextlib.suppress(OSError):
        connection.send(report)


def _start_watch(watch: Watch) -> None:
    match watch:
        case "guard":
            from exo_orphan_guard import guard_runner

            guard_runner(runner_id=f"scenario-{os.getpid()}", instance_id="scenario")
        case "pr2205":
            threading.Thread(target=_pr2205_poll, daemon=True).start()
        case "none":
            pass


def _pr2205_poll() -> None:
    """exo PR 2205's proposal: poll getppid() every 5 s, exit when it changes."""
    original = os.getppid()
    while True:
        time.sleep(PR2205_POLL_SECONDS)
        if os.getppid() != original:
            os._exit(1)


def run_worker(spec: WorkerSpec) -> None:
    if spec["watch"] == "guard":
        from exo_orphan_guard import prepare_worker

        prepare_worker()
    context = multiprocessing.get_context("spawn")
    readers: list[multiprocessing.connection.Connection] = []
    keep: list[object] = []

    def spawn_all() -> None:
        for kind in spec["runners"]:
            reader, writer = multiprocessing.Pipe(duplex=False)
            process = context.Process(
                target=runner_main, args=(kind, spec["watch"], spec["go_file"], writer), daemon=True
            )
            process.start()
            writer.close()
            readers.append(reader)
            keep.append(process)

    reports = _run_in(spec["spawn_from"], spawn_all, lambda: _collect(readers))
    print(json.dumps(WorkerReport(worker=os.getpid(), runners=reports)), flush=True)
    while True:
        time.sleep(3600)


def _run_in(
    where: SpawnFrom, spawn: Callable[[], None], collect: Callable[[], list[RunnerReport]]
) -> list[RunnerReport]:
    """Spawn from the main thread, or from a thread that ends once runners are armed."""
    if where == "main":
        spawn()
        return collect()
    result: list[RunnerReport] = []

    def spawn_then_wait() -> None:
        spawn()
        result.extend(collect())

    thread = threading.Thread(target=spawn_then_wait, name="spawner")
    thread.start()
    thread.join()
    return result


def _collect(readers: list[multiprocessing.connection.Connection]) -> list[RunnerReport]:
    reports: list[RunnerReport] = []
    for reader in readers:
        if not reader.poll(_READY_TIMEOUT_SECONDS):
            raise SystemExit("a runner did not report within the timeout")
        reports.append(cast(RunnerReport, reader.recv()))
    return reports


if __name__ == "__main__":
    run_worker(cast(WorkerSpec, json.loads(sys.argv[1])))
