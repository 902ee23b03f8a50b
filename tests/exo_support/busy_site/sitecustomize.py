"""Keeps exo's real runner busy in long MLX evals, for tests/test_exo_integration.py.

On PYTHONPATH with `EOG_BUSY_EVAL_NOTES` set: in a multiprocessing child (exo's
runner), the first blocking queue `get` on its main thread (main: `Runner.main`'s
`_work_queue.get()`; v1.0.71: `MpReceiver.receive()`, both right where exo would run
a task, after the runner reported `RunnerIdle`) runs one `mx.eval` of a few seconds
after another instead, as a prefill would, and writes each start to
`<EOG_BUSY_EVAL_NOTES>/<pid>.jsonl`. A worker's death there raises `WorkerGone` out
of this call once an eval returns, into exo's own code; with `EOG_BUSY_LOG_FLOOD` set
it first logs that many bytes through the logger exo gave its runner (exo's
`logger_setup`: loguru sinks with `enqueue=True`, read by the dead worker), and notes
it. Anywhere else it does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

_NOTES = os.environ.get("EOG_BUSY_EVAL_NOTES", "")
LONG_EVAL_SECONDS = 3.0


def _note(event: str, **details: object) -> None:
    import json
    import time

    line = json.dumps({"event": event, "at": time.monotonic(), **details})
    with open(os.path.join(_NOTES, f"{os.getpid()}.jsonl"), "a") as file:
        file.write(line + "\n")


def _long_evals() -> None:
    import time

    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    base: Any = mx.ones((512, 512)) / 512  # pyright: ignore
    mx.eval(base)  # pyright: ignore

    def product(steps: int) -> Any:
        result: Any = base
        for _ in range(steps):
            result = result @ base
        return result

    steps, last = 8, 0.0
    try:
        while True:
            graph = product(steps)
            _note("eval begun", steps=steps, last=last)
            began = time.monotonic()
            mx.eval(graph)  # pyright: ignore
            last = time.monotonic() - began
            if last < LONG_EVAL_SECONDS:
                steps = int(steps * 1.2 * LONG_EVAL_SECONDS / max(last, 1e-3))
    except BaseException:
        _flood_exos_log()
        raise


def _flood_exos_log() -> None:
    import sys

    wanted = int(os.environ.get("EOG_BUSY_LOG_FLOOD", "0") or "0")
    bootstrap = sys.modules.get("exo.worker.runner.bootstrap")
    logger: Any = getattr(bootstrap, "logger", None)
    if wanted <= 0 or logger is None:
        return
    line = "x" * 1000
    for number in range(wanted // len(line) + 1):
        logger.info(f"runner {os.getpid()} after its worker died, part {number}: {line}")
    _note("logged", bytes=wanted)


def _busy_first(original: Callable[..., Any]) -> Callable[..., Any]:
    import multiprocessing
    import threading

    done: list[bool] = []

    def get(self: object, block: bool = True, *args: object, **kwargs: object) -> Any:
        if (
            block
            and not done
            and threading.current_thread() is threading.main_thread()
            and multiprocessing.parent_process() is not None
        ):
            done.append(True)
            _long_evals()
        return original(self, block, *args, **kwargs)

    return get


if _NOTES:
    import multiprocessing.queues
    import queue

    queue.Queue.get = _busy_first(queue.Queue.get)  # pyright: ignore[reportAttributeAccessIssue]
    multiprocessing.queues.Queue.get = _busy_first(  # pyright: ignore[reportAttributeAccessIssue]
        multiprocessing.queues.Queue.get  # pyright: ignore[reportUnknownMemberType]
    )
