"""What the busy stand-in runners do (`scenario_worker`): native calls that let go of
the GIL or hold it, a watchdog that fails, exo's enqueued logger."""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, NoReturn

from .notes import RunnerNotes

if TYPE_CHECKING:
    from loguru import Logger

LONG_EVAL_SECONDS: Final = 3.0
GIL_BUSY_SECONDS: Final = 1.5
_TIMED_EVAL_SECONDS: Final = 0.25


def one_long_eval_after_another(note: RunnerNotes) -> None:
    """Each `mx.eval` one graph of matrix products, sized to take `LONG_EVAL_SECONDS`
    here (its "eval begun" note says `sized` once it is); MLX lets go of the GIL while
    it runs."""
    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    held = mx.ones((16 * 2**20,), dtype=mx.float32)  # pyright: ignore
    base = mx.ones((512, 512)) / 512  # pyright: ignore  # (mx.random would hold its key)
    mx.eval(held, base)  # pyright: ignore
    # Registered before the guard's own release (at exit the last registered runs
    # first): what MLX still holds once the guard has collected and cleared its cache.
    atexit.register(
        lambda: note.write(
            "exit",
            active=int(mx.get_active_memory()),
            cache=int(mx.get_cache_memory()),  # pyright: ignore
        )
    )

    def product(steps: int) -> object:
        result = base  # pyright: ignore
        for _ in range(steps):
            result = result @ base  # pyright: ignore
        return result  # pyright: ignore

    steps, last, sized, warm = 8, 0.0, False, False
    while True:
        graph = product(steps)
        note.write("eval begun", steps=steps, last=last, sized=sized)
        began = time.monotonic()
        mx.eval(graph)  # pyright: ignore
        last = time.monotonic() - began
        note.write("eval returned", seconds=last)
        # This machine's speed (and load) sizes the next one, timed on an eval long
        # enough to time (grown until one is, so that sizing costs about a second) and
        # never on the first, which pays MLX's warm-up and would size the next too short.
        if last < _TIMED_EVAL_SECONDS:
            steps *= 4
        elif warm and last < LONG_EVAL_SECONDS:
            steps, sized = int(steps * 1.5 * LONG_EVAL_SECONDS / last), True
        elif warm:
            sized = True
        warm = True


def busy_in_native_code_holding_the_gil(note: RunnerNotes) -> None:
    """One native call that holds the GIL, with every signal blocked in this thread
    (as C++ code that masks signals around its work), and returns."""
    every = signal.valid_signals()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, every)
    try:
        note.write("native begun")
        ctypes.PyDLL(None).usleep(int(GIL_BUSY_SECONDS * 1_000_000))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    note.write("native returned")


def busy_in_native_code_letting_go_of_the_gil(note: RunnerNotes) -> None:
    seconds = float(os.environ.get("EOG_NATIVE_SECONDS", "2"))
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        note.write("native begun", seconds=seconds)
        ctypes.CDLL(None).usleep(int(seconds * 1_000_000))  # CDLL: the GIL is let go
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    note.write("native returned")


def break_the_watchdog() -> None:
    """The error a test injects: the watchdog (forked from here, so it inherits this)
    fails as it begins to await the ending."""
    from exo_orphan_guard.watch import watchdog

    def fail(*args: object) -> NoReturn:
        raise RuntimeError("injected by the test")

    watchdog._await_the_ending = fail  # pyright: ignore[reportPrivateUsage]


def exos_logger() -> Logger:
    """What exo's `logger_setup(None)` makes: one sink, `enqueue=True` (a queue into a
    thread of this process), that the runner gets pickled with its arguments."""
    from loguru import logger

    if not getattr(exos_logger, "done", False):
        logger.remove()
        logger.add(sys.stderr, format="{message}", level="INFO", enqueue=True)
        exos_logger.done = True  # pyright: ignore[reportFunctionMemberAccess]
    return logger


def loop_over_mlx() -> None:
    """Hold 64 MB in MLX arrays and run small operations on them for ever, steps of a
    few ms as in a decode loop."""
    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    held = mx.ones((16 * 2**20,), dtype=mx.float32)  # pyright: ignore
    mx.eval(held)  # pyright: ignore
    step = held[: 2**20]  # pyright: ignore
    while True:
        mx.eval(mx.sum(step * 1.0001))  # pyright: ignore


def in_native_code_path(go_file: str, pid: int) -> str:
    """Made by a `gil`, `deaf`, `faulty` or `wedged` runner just before its native call
    (`scenarios.wait_in_native_code` waits for it, however slowly a loaded machine
    starts the runner)."""
    return f"{go_file}.native-{pid}"


def entering_native_code(go_file: str) -> None:
    with open(in_native_code_path(go_file, os.getpid()), "w"):
        pass


def wedge_in_native_code(entering: Callable[[], None]) -> None:
    """Hold the GIL in native code that never returns, whatever comes: the notice and
    SIGINT are blocked in this thread, as in a C++ call that retries on EINTR (MLX's
    init): SIGINT from outside stays pending, and only SIGKILL ends it. `entering` is
    told first, once the signals are blocked."""
    from exo_orphan_guard.watch.clean_ending import NOTICE_SIGNAL

    signal.pthread_sigmask(signal.SIG_BLOCK, {NOTICE_SIGNAL, signal.SIGINT})
    entering()
    ctypes.PyDLL(None).sleep(3600)


def hold_the_gil_in_native_code(entering: Callable[[], None]) -> None:
    """Hold the GIL in native code that does not return to Python when the guard's
    notice comes, as a C++ call that retries on EINTR does (MLX's init): with the
    notice blocked in this thread, nothing Python runs in the process until it ends.
    `entering` is told first."""
    from exo_orphan_guard.watch.clean_ending import NOTICE_SIGNAL

    signal.pthread_sigmask(signal.SIG_BLOCK, {NOTICE_SIGNAL})
    entering()
    ctypes.PyDLL(None).sleep(3600)
