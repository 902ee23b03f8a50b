"""Puts exo's real runner where a worker's death can find it, for tests/test_exo_steps.py.

On PYTHONPATH with `EOG_STEPS_MODE` and `EOG_STEPS_NOTES` set: in a multiprocessing
child (exo's runner), the first blocking queue `get` on its main thread (right where
exo would take its next task, after the runner reported `RunnerIdle`) first does, by
mode:

- `load`: short MLX evals one after another in Python, never looking at its tasks,
  as exo's weight loading does between layers;
- `eval`: one `mx.eval` of about `EOG_STEPS_EVAL_SECONDS`, then back to exo's loop;
- `gil`: a native call that holds the GIL and never returns; with
  `EOG_STEPS_GIL_AFTER_GO` set, only once `<EOG_STEPS_NOTES>/<pid>.go` exists (the
  steps test makes it when the worker has seen the runner idle: held sooner, the GIL
  would keep the event queue's feeder thread from ever sending `RunnerIdle`);
- `decode`: exo's own decode loop (`Runner.handle_generation_tasks`, exo main) on a
  text generation that never finishes, its engine one short `mx.eval` per step (no
  model: exo's loop, its checks between steps and its `shutdown` are exo's own).

With `EOG_STEPS_SKIP_GETS=N` it starts only at the first blocking `get` after N
`get`s on the main thread have returned an item, blocking or not (N=1: the runner
has taken its first task, as exo's ConnectToGroup; v1.0.71's loop may find it
waiting and take it with a non-blocking `get`).

Each start goes to `<EOG_STEPS_NOTES>/<pid>.jsonl`. Anywhere else it does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

_MODE = os.environ.get("EOG_STEPS_MODE", "")
_NOTES = os.environ.get("EOG_STEPS_NOTES", "")
_SKIP = int(os.environ.get("EOG_STEPS_SKIP_GETS", "0") or "0")


def _note(event: str, **details: object) -> None:
    import json
    import time

    line = json.dumps({"event": event, "at": time.monotonic(), **details})
    with open(os.path.join(_NOTES, f"{os.getpid()}.jsonl"), "a") as file:
        file.write(line + "\n")


def _matrix() -> Any:
    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    base: Any = mx.ones((256, 256)) / 256  # pyright: ignore
    mx.eval(base)  # pyright: ignore
    return base


def _load() -> None:
    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    base = _matrix()
    _note("loading")
    while True:
        mx.eval(base @ base)  # pyright: ignore


def _eval() -> None:
    import time

    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    base = _matrix()
    wanted = float(os.environ.get("EOG_STEPS_EVAL_SECONDS", "4"))
    steps = 8
    while True:  # sized first, as a prefill chunk of a known length
        graph = base
        for _ in range(steps):
            graph = graph @ base
        began = time.monotonic()
        mx.eval(graph)  # pyright: ignore
        took = time.monotonic() - began
        if took >= wanted * 0.9:
            break
        steps = int(steps * 1.2 * wanted / max(took, 1e-3))
    graph = base
    for _ in range(steps):
        graph = graph @ base
    _note("eval begun", steps=steps)
    mx.eval(graph)  # pyright: ignore
    _note("eval returned")


def _gil() -> None:
    import ctypes
    import signal
    import time

    go = os.path.join(_NOTES, f"{os.getpid()}.go")
    while os.environ.get("EOG_STEPS_GIL_AFTER_GO") and not os.path.exists(go):
        time.sleep(0.02)
    _note("holding the gil")
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    while True:
        ctypes.PyDLL(None).sleep(3600)  # PyDLL: the GIL stays held


def _decode(runner: Any) -> None:
    import mlx.core as mx  # pyright: ignore[reportMissingImports]
    from exo.shared.types.common import CommandId  # pyright: ignore
    from exo.shared.types.tasks import TextGeneration  # pyright: ignore
    from exo.shared.types.worker.runners import RunnerReady  # pyright: ignore
    from exo.worker.engines.base import Engine  # pyright: ignore

    base = _matrix()

    class Forever(Engine):  # pyright: ignore
        def warmup(self) -> None: ...
        def submit(self, task: Any) -> None: ...
        def close(self) -> None: ...
        def serve_prefill(self, request: Any, wfile: Any) -> None: ...

        def step(self) -> list[Any]:
            mx.eval(base @ base @ base)  # pyright: ignore
            return []

    runner.generator = Forever()
    runner.current_status = RunnerReady()
    task: Any = TextGeneration.model_construct(  # pyright: ignore
        instance_id=runner.bound_instance.instance.instance_id,
        command_id=CommandId(),
        task_params=None,
    )
    _note("decoding")
    runner.handle_generation_tasks(task)


def _first(original: Callable[..., Any]) -> Callable[..., Any]:
    import multiprocessing
    import sys
    import threading

    done: list[bool] = []
    passed: list[bool] = []

    def get(self: object, block: bool = True, *args: object, **kwargs: object) -> Any:
        if len(passed) < _SKIP and threading.current_thread() is threading.main_thread():
            item = original(self, block, *args, **kwargs)
            passed.append(True)
            return item
        if (
            block
            and not done
            and threading.current_thread() is threading.main_thread()
            and multiprocessing.parent_process() is not None
        ):
            done.append(True)
            caller: Any = sys._getframe(1).f_locals.get("self")  # pyright: ignore
            match _MODE:
                case "load":
                    _load()
                case "eval":
                    _eval()
                case "gil":
                    _gil()
                case "decode" if caller is not None and hasattr(caller, "handle_generation_tasks"):
                    _decode(caller)
                    # exo's own shutdown ran: its loop ends as on a closed task stream.
                    from exo.worker.runner.runner import (  # pyright: ignore
                        _TaskStreamClosed,  # pyright: ignore
                    )

                    return _TaskStreamClosed()  # pyright: ignore
                case _:
                    pass
        return original(self, block, *args, **kwargs)

    return get


if _MODE and _NOTES:
    import multiprocessing.queues
    import queue

    queue.Queue.get = _first(queue.Queue.get)  # pyright: ignore[reportAttributeAccessIssue]
    multiprocessing.queues.Queue.get = _first(  # pyright: ignore[reportAttributeAccessIssue]
        multiprocessing.queues.Queue.get  # pyright: ignore[reportUnknownMemberType]
    )
