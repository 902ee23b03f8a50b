"""What the stand-in runners whose clean ending meets a hazard do (`scenario_worker`):
the notice landing while a loguru sink's lock is held, or once the interpreter's exit
is under way; a thread logging toward the dead worker while the main thread is in
native code."""

from __future__ import annotations

import atexit
import multiprocessing.queues
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Final, NoReturn, cast

from . import native_calls
from .notes import RunnerNotes

if TYPE_CHECKING:
    from loguru import Logger

_LOG_FLOOD_BYTES: Final = 3 * 2**19
_FLOOD_LINES: Final = 2000
SLOW_SINK_SECONDS: Final = 0.005
"""How long the `slowsink` runner's sink takes to write a line: the main thread spends
nearly all its time inside the sink, holding its lock."""
EXIT_STEPS: Final = 20
"""Steps of the `exit` runner's atexit hook, `EXIT_STEP_SECONDS` each."""
THREAD_STEPS: Final = 10
"""Steps of the `exit` runner's non-daemon thread, `EXIT_STEP_SECONDS` each."""
EXIT_STEP_SECONDS: Final = 0.05
THREAD_LINE: Final = "x" * 1024
THREAD_LINE_SECONDS: Final = 0.01
"""The `logthread` runner's thread logs a line of about 1 KiB this often: the 64 KiB
pipe of its worker's sink fills about half a second after the worker's death, well
after the notice (within 100 ms on every backend), long before the native call
returns."""


def log_through_a_slow_sink(note: RunnerNotes) -> NoReturn:
    """Log one line after another through a sink of its own, added with `catch=False`
    (so that loguru's errors reach the caller) and slow to write: the notice lands
    while this thread holds the sink's lock. An error is noted and the loop goes on, as
    exo's runner reports a failed task and takes the next one: only WorkerGone, a
    BaseException, leaves the loop."""
    from loguru import logger

    logger.remove()
    logger.add(lambda _: time.sleep(SLOW_SINK_SECONDS), format="{message}", catch=False)
    note.write("logging")
    number = 0
    while True:
        number += 1
        try:
            logger.info(f"step {number}")
        except Exception as error:
            note.write("logging failed", type=type(error).__name__, detail=str(error))


def return_with_work_left(note: RunnerNotes, go_file: str) -> None:
    """Once asked to shut down (`<go_file>.shutdown`), start a non-daemon thread with
    `THREAD_STEPS` steps left and register an atexit hook of `EXIT_STEPS`, then return:
    the interpreter's exit joins the thread, then runs the hook. Its stderr goes to
    `note.stderr_path` first, where a test reads what the exit printed."""
    if (stderr := note.stderr_path) is not None:
        with open(stderr, "a") as file:
            os.dup2(file.fileno(), 2)
    while not os.path.exists(f"{go_file}.shutdown"):
        time.sleep(0.005)
    atexit.register(_steps_at_exit, note)
    threading.Thread(target=_steps_in_a_thread, args=(note,), name="work-left").start()
    note.write("returning")


def _steps_in_a_thread(note: RunnerNotes) -> None:
    try:
        for step in range(THREAD_STEPS):
            note.write("thread step", step=step)
            time.sleep(EXIT_STEP_SECONDS)
    finally:
        note.write("thread finally")


def _steps_at_exit(note: RunnerNotes) -> None:
    for step in range(EXIT_STEPS):
        note.write("exit step", step=step)
        time.sleep(EXIT_STEP_SECONDS)
    note.write("exit done")


def log_from_a_thread_while_busy(note: RunnerNotes, logger: Logger) -> None:
    """A non-daemon thread logs through the sink its worker set up with `enqueue=True`
    (exo's logger), while the main thread makes one native call that lets go of the
    GIL after another (`EOG_NATIVE_SECONDS`, every signal blocked in it); the thread
    stops once the main thread unwinds. With the worker gone nobody reads the sink's
    pipe: a write that finds it full blocks for good, and so does the exit's join."""
    stop = threading.Event()
    thread = threading.Thread(target=_log_until, args=(note, logger, stop), name="logging")
    thread.start()
    try:
        while True:
            native_calls.busy_in_native_code_letting_go_of_the_gil(note)
    finally:
        stop.set()


def _log_until(note: RunnerNotes, logger: Logger, stop: threading.Event) -> None:
    lines = 0
    try:
        while not stop.is_set():
            logger.info(f"runner {os.getpid()} thread line {lines}: {THREAD_LINE}")
            lines += 1
            time.sleep(THREAD_LINE_SECONDS)
    finally:
        note.write("thread finally", lines=lines)


def end_after_catching(kind: str, worker_end: object, note: RunnerNotes) -> None:
    """The clean ending of a stand-in runner that caught WorkerGone: `hang` never
    finishes it; `loguru` logs more than its worker's sink pipe holds; `noisy` floods
    its widowed stdout, stderr and log; `queue` fills its worker's queue."""
    if kind == "hang":
        from exo_orphan_guard import ending_cleanly

        with ending_cleanly():  # a clean-up of its own that never finishes
            while True:
                time.sleep(3600)
    info: object = getattr(worker_end, "info", None)
    if kind == "loguru" and callable(info):
        line = "x" * 1000
        for number in range(_LOG_FLOOD_BYTES // len(line) + 1):
            info(f"runner {os.getpid()} releasing part {number}: {line}")
        note.write("logged", bytes=_LOG_FLOOD_BYTES)
    if kind == "noisy":
        from loguru import logger

        for number in range(_FLOOD_LINES):
            print(f"runner {os.getpid()} shutting down, line {number}", flush=True)
            print(f"runner {os.getpid()} warning {number}", file=sys.stderr, flush=True)
            if number % 100 == 0:
                logger.info(f"runner {os.getpid()} released part {number}")
    if kind == "queue" and isinstance(worker_end, multiprocessing.queues.Queue):
        queue = cast("multiprocessing.queues.Queue[bytes]", worker_end)
        for _ in range(64):
            queue.put(b"x" * 4096)  # 256 KiB: more than the pipe holds
