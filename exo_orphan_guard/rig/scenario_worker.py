"""A stand-in for exo's worker and runners, for the self-test, the demo and the tests.

The worker spawns runners the way exo does (multiprocessing spawn context,
`daemon=True`, `prepare_worker()` first, `guard_runner()` at the top of the runner),
prints one JSON line describing them once they are armed, then waits to be killed.

    python -m exo_orphan_guard.rig.scenario_worker '<WorkerSpec JSON>'
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.queues
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from multiprocessing.resource_sharer import DupFd
from typing import TYPE_CHECKING, Literal, TypeAlias, TypedDict, cast

if TYPE_CHECKING:
    from loguru import Logger

# The kinds' own modules (ending_hazards, exo_runner, native_calls, notice_blockers,
# runner_threads) are imported where a kind uses them: every worker and runner imports
# this module, the suite starts thousands, and they cost each about 70 ms of CPU.
from . import runner_guards, stand_in_exo
from .notes import RunnerNotes
from .runner_kinds import CATCHING, EXO_KINDS, RunnerKind

stand_in_exo.as_exo_main(__name__)  # in its runners too, which re-run this module

Watch = Literal["guard", "exo", "pr2205", "none"]
"""exo: guarded as exo's patched entrypoint guards its runners (`exo_runner`)."""
SpawnFrom = Literal["main", "thread"]

WorkerEnd: TypeAlias = (
    "DupFd | multiprocessing.queues.Queue[bytes] | Logger | tuple[object, object, object] | None"
)
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
    """For `late` runners: they call guard_runner() only once this file exists;
    `shutdown` and `exit` runners begin their shutdown once `<go_file>.shutdown` exists,
    and a worker of exo-shaped runners then sends each of them exo's `Shutdown`."""
    notes: str
    """A directory where runners write what happened to them (`<pid>.jsonl`), read by
    tests once the worker is gone; empty: none."""


SHUTDOWN_SECONDS = 1.5
"""How long a `shutdown` runner's own shutdown takes (unless SHUTDOWN_SECONDS_ENV, or
`scenarios.finish_shutdown` ends it sooner):
longer than the second after which a WorkerGone is raised again outside
`ending_cleanly()`."""
SHUTDOWN_SECONDS_ENV = "EOG_SCENARIO_SHUTDOWN_SECONDS"
SLOW_EXIT_SECONDS = 3.0
"""How long a `slowexit` runner's unwinding takes (as issue 40 reproduced two
guardians' SIGINTs cutting one short)."""
SLOW_FORK_SECONDS_ENV = "EOG_SCENARIO_SLOW_FORK_SECONDS"
"""Seconds a process this runner forks (its watchdog) sleeps before its first line of
its own, as coverage's fork hook or a loaded machine can keep it: the runner may be
gone by then."""


def runner_main(
    kind: RunnerKind,
    watch: Watch,
    go_file: str,
    report: multiprocessing.connection.Connection,
    notes: str = "",
    worker_end: WorkerEnd = None,
) -> None:
    """`worker_end`: for `noisy`, the pipe to its worker to put on its stdout and
    stderr; for `queue`, the queue to its worker; for `loguru` and `logthread`, its
    worker's logger."""
    if isinstance(worker_end, DupFd):
        captured = worker_end.detach()
        for fd in (1, 2):
            os.dup2(captured, fd)
        os.close(captured)
    if kind == "late":
        _report(report, RunnerReport(pid=os.getpid(), children=[]))
        while not os.path.exists(go_file):
            time.sleep(0.005)
    note = RunnerNotes(notes)
    if watch == "none":
        # The probe that an unguarded runner exited through Python (unwound, not killed).
        atexit.register(note.write, "atexit")
    if kind == "faulty":
        from . import native_calls

        native_calls.break_the_watchdog()
    if slow_fork := os.environ.get(SLOW_FORK_SECONDS_ENV):
        os.register_at_fork(after_in_child=lambda: time.sleep(float(slow_fork)))
    if kind in ("masked", "maskedsleep"):
        from . import notice_blockers

        notice_blockers.block_the_notice()
    if kind in CATCHING:  # imported now, not once the runner is unwinding
        from . import ending_hazards
    runner_guards.start_watch(watch, worker_end)
    try:
        if kind in ("dumps", "dumpsread", "dumpslow"):  # before the report: it is killed then
            from . import notice_blockers

            notice_blockers.dump_stacks_on_the_notice(go_file if kind == "dumpslow" else None)
        children: list[int] = []
        if kind == "child":
            children.append(subprocess.Popen(["/bin/sleep", "3600"]).pid)
        if kind == "strays":
            sleep = ["/bin/sleep", "3600"]
            children.append(subprocess.Popen(sleep, start_new_session=True).pid)
            children.append(subprocess.Popen(sleep, process_group=0).pid)
        if kind != "late":
            # Connection.send writes synchronously: it is out before the GIL is taken.
            _report(report, RunnerReport(pid=os.getpid(), children=children))
        _behave(kind, note, go_file, worker_end)
    except BaseException as error:
        note.write("raised", type=type(error).__name__)
        if kind not in CATCHING or type(error).__name__ != "WorkerGone":
            raise
        note.write("caught")
        from . import ending_hazards

        try:
            ending_hazards.end_after_catching(kind, worker_end, note)
        except BaseException as problem:
            note.write("ending failed", type=type(problem).__name__, detail=str(problem))
            raise
        note.write("done")
    finally:
        note.write("finally")


def _behave(kind: RunnerKind, note: RunnerNotes, go_file: str, worker_end: WorkerEnd) -> None:
    if kind in EXO_KINDS and isinstance(worker_end, tuple):
        from . import exo_runner

        exo_runner.behave(kind, note, worker_end[1], worker_end[2])
        return
    if kind == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if kind in ("gil", "deaf", "faulty", "wedged", "mlxbusy", "gilbusy", "gilfree", "mlxloop"):
        _behave_in_native_code(kind, note, go_file)
    if kind == "threads":
        from . import runner_threads

        runner_threads.wait_for_a_task_among_threads(note)
    if kind in ("slowsink", "logthread", "exit"):
        from . import ending_hazards

        if kind == "slowsink":
            ending_hazards.log_through_a_slow_sink(note)
        if kind == "logthread" and not isinstance(worker_end, DupFd | Queue | tuple | None):
            ending_hazards.log_from_a_thread_while_busy(note, worker_end)
        if kind == "exit":
            ending_hazards.return_with_work_left(note, go_file)
            return
    if kind == "swallow":
        try:
            note.write("swallowing")  # ready: from inside the block that swallows
            while True:
                time.sleep(3600)
        except:  # noqa: E722  # as exo's vendored deepseek_v4_encoding.py does
            note.write("swallowed")
    if kind == "slowexit":
        try:
            while True:
                time.sleep(3600)
        finally:
            note.write("unwinding")
            time.sleep(SLOW_EXIT_SECONDS)
            note.write("unwound")
    if kind == "shutdown":
        while not os.path.exists(f"{go_file}.shutdown"):  # asked, as by exo's Shutdown task
            time.sleep(0.005)
        note.write("shutting down")
        from exo_orphan_guard import ending_cleanly

        with ending_cleanly():
            # The worker is killed meanwhile. `<go>.finish` ends it sooner: a test holds
            # it until it has looked, however late a loaded machine lets it look.
            seconds = float(os.environ.get(SHUTDOWN_SECONDS_ENV, SHUTDOWN_SECONDS))
            until = time.monotonic() + seconds
            while time.monotonic() < until and not os.path.exists(f"{go_file}.finish"):
                time.sleep(0.005)
        note.write("shut down")
        return
    while kind == "masked":
        time.sleep(0.05)
    if kind in ("dumpsread", "dumpslow"):
        from . import notice_blockers

        notice_blockers.wait_in_one_read()
    while kind == "talk":
        print(f"runner {os.getpid()} tick {time.monotonic():.3f}", flush=True)
        time.sleep(0.05)
    if kind == "maskedsleep":
        note.write("asleep")  # the test's cue: in Python until this sleep begins
    while True:
        time.sleep(3600)


def _behave_in_native_code(kind: RunnerKind, note: RunnerNotes, go_file: str) -> None:
    from . import native_calls

    entering = functools.partial(native_calls.entering_native_code, go_file)
    if kind in ("gil", "deaf", "faulty"):
        native_calls.hold_the_gil_in_native_code(entering)
    if kind == "wedged":
        native_calls.wedge_in_native_code(entering)
    if kind == "mlxbusy":
        native_calls.one_long_eval_after_another(note)
    while kind == "gilbusy":
        native_calls.busy_in_native_code_holding_the_gil(note)
    while kind == "gilfree":
        native_calls.busy_in_native_code_letting_go_of_the_gil(note)
    if kind == "mlxloop":
        native_calls.loop_over_mlx()


def _report(connection: multiprocessing.connection.Connection, report: RunnerReport) -> None:
    """Like exo's runners, live on when the worker is gone: an orphan, not a crash."""
    with contextlib.suppress(OSError):
        connection.send(report)


def run_worker(spec: WorkerSpec) -> None:
    multiprocessing.set_start_method("spawn", force=True)  # as exo's main does
    if spec["watch"] == "exo":
        from . import exo_runner

        exo_runner.use_exo_shaped()
    if spec["watch"] == "guard":  # exo's hooks module records nothing for its runners
        from exo_orphan_guard import prepare_worker

        prepare_worker()
    context = multiprocessing.get_context("spawn")
    readers: list[multiprocessing.connection.Connection] = []
    keep: list[object] = []
    exo_ends: list[tuple[object, object, object]] = []

    def spawn_all() -> None:
        for kind in spec["runners"]:
            reader, writer = multiprocessing.Pipe(duplex=False)
            worker_end: WorkerEnd
            if spec["watch"] == "exo":
                from . import exo_runner

                worker_end = exo_runner.channel_and_instance(f"scenario-{len(readers)}")
                exo_ends.append(worker_end)
            else:
                worker_end = _worker_end(kind, context, keep)
            process = context.Process(
                target=runner_main,
                args=(kind, spec["watch"], spec["go_file"], writer, spec["notes"], worker_end),
                daemon=True,
            )
            process.start()
            writer.close()
            readers.append(reader)
            keep.extend((process, worker_end))  # a queue's semaphores die with it

    reports = _run_in(spec["spawn_from"], spawn_all, lambda: _collect(readers))
    if spec["watch"] == "exo":
        from . import exo_runner

        exo_runner.shut_down_when_asked(spec["go_file"], exo_ends, spec["notes"])
    print(json.dumps(WorkerReport(worker=os.getpid(), runners=reports)), flush=True)
    while True:
        time.sleep(3600)


def _worker_end(
    kind: RunnerKind, context: multiprocessing.context.SpawnContext, keep: list[object]
) -> WorkerEnd:
    """What only this worker reads from its runner: a pipe it drains, a queue, or the
    logger whose enqueued sink it writes out."""
    if kind in ("loguru", "logthread"):
        from . import native_calls

        return native_calls.exos_logger()
    if kind == "queue":
        queue: multiprocessing.queues.Queue[bytes] = context.Queue()
        keep.append(queue)
        return queue
    if kind != "noisy":
        return None
    read_end, write_end = os.pipe()
    threading.Thread(target=_drain, args=(read_end,), daemon=True).start()
    shared = DupFd(write_end)
    os.close(write_end)
    keep.append(shared)
    return shared


def _drain(fd: int) -> None:
    while os.read(fd, 65536):
        pass


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
