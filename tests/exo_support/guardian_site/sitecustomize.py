"""Marks how exo's real, unpatched runner leaves, for tests/test_exo_guardian.py.

On PYTHONPATH with `EOG_GUARDIAN_NOTES` set, in exo's runner only (a process started
with `--multiprocessing-fork`, not the resource tracker) it appends JSON lines to
`<EOG_GUARDIAN_NOTES>/<pid>.jsonl`:

- `atexit` (the probe): from an atexit handler registered at the runner's start, so
  the line is there only when the runner left through Python's own exit;

and, by `EOG_GUARDIAN_MODE`, at the first blocking queue `get` on its main thread
(right where exo takes its next task, after the runner reported `RunnerIdle`):

- `idle`: nothing; the runner waits for its next task;
- `eval`: one `mx.eval` of about `EOG_GUARDIAN_EVAL_SECONDS` (`eval begun`, then
  `eval returned` with how long it took and what was raised when it returned), then
  back to exo's loop;
- `decode` (exo main): exo's own decode loop (`Runner.handle_generation_tasks`) on a
  text generation that never finishes (made here, so not acknowledged to the worker,
  which never sent it), each step one short `mx.eval` and one token,
  which exo's loop sends to its worker as a `ChunkGenerated` event over exo's own event
  channel (`decoding`); once that channel's pipe is full and its feeder thread holds
  events it cannot write (the worker stopped reading), `event pipe full`; what ends
  the loop, `decode left` (the exception's name).

Anywhere else it does nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

_NOTES = os.environ.get("EOG_GUARDIAN_NOTES", "")
_MODE = os.environ.get("EOG_GUARDIAN_MODE", "idle")
_PIPE_FULL_BYTES = 48 * 1024
"""A pipe holds 16 pages: 64 KiB, less when messages do not fill a page (57 KiB of
exo's 610-byte `ChunkGenerated` lines)."""
_HELD_EVENTS = 50
"""Events the feeder thread holds back: it cannot write them (a worker that reads
keeps up with one step at a time)."""


def _note(event: str, **details: object) -> None:
    import json
    import time

    line = json.dumps({"event": event, "at": time.monotonic(), **details})
    with open(os.path.join(_NOTES, f"{os.getpid()}.jsonl"), "a") as file:
        file.write(line + "\n")


def _matrix(size: int) -> Any:
    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    base: Any = mx.ones((size, size)) / size  # pyright: ignore
    mx.eval(base)  # pyright: ignore
    return base


def _eval() -> None:
    import time

    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    base = _matrix(256)
    wanted = float(os.environ.get("EOG_GUARDIAN_EVAL_SECONDS", "6"))
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
    _note("eval begun", steps=steps, wanted=wanted)
    began = time.monotonic()
    raised: str | None = None
    try:
        mx.eval(graph)  # pyright: ignore
    except BaseException as error:  # a signal taken the moment the call returned
        raised = type(error).__name__
        raise
    finally:
        _note("eval returned", took=time.monotonic() - began, raised=raised)


def _in_pipe(sender: Any) -> tuple[int, int]:
    """Bytes in exo's event channel's pipe (whose read end the runner holds too), and
    how many events its feeder holds back."""
    import fcntl
    import termios

    queue: Any = sender._state.buffer  # pyright: ignore
    waiting = bytearray(4)
    fcntl.ioctl(queue._reader.fileno(), termios.FIONREAD, waiting)  # pyright: ignore
    return int.from_bytes(waiting, sys.byteorder), len(queue._buffer)  # pyright: ignore


def _decode(runner: Any) -> None:
    import mlx.core as mx  # pyright: ignore[reportMissingImports]
    from exo.shared.types.chunks import TokenChunk  # pyright: ignore
    from exo.shared.types.common import CommandId  # pyright: ignore
    from exo.shared.types.tasks import TextGeneration  # pyright: ignore
    from exo.shared.types.worker.runners import RunnerReady  # pyright: ignore
    from exo.worker.engines.base import Engine  # pyright: ignore

    base = _matrix(128)
    model = runner.bound_instance.bound_shard.model_card.model_id
    task: Any = TextGeneration.model_construct(  # pyright: ignore
        instance_id=runner.bound_instance.instance.instance_id,
        command_id=CommandId(),
        task_params=None,
    )
    full: list[bool] = []
    steps: list[bool] = []

    class Forever(Engine):  # pyright: ignore
        def warmup(self) -> None: ...
        def submit(self, task: Any) -> None: ...
        def close(self) -> None: ...
        def serve_prefill(self, request: Any, wfile: Any) -> None: ...

        def step(self) -> list[Any]:
            mx.eval(base @ base)  # pyright: ignore
            steps.append(True)
            if not full:
                in_pipe, held = _in_pipe(runner.event_sender)
                if in_pipe >= _PIPE_FULL_BYTES and held >= _HELD_EVENTS:
                    full.append(True)
                    _note("event pipe full", steps=len(steps), in_pipe=in_pipe, held=held)
            token = TokenChunk(model=model, text=" token", token_id=1, usage=None)  # pyright: ignore
            return [(task.task_id, token)]

    runner.generator = Forever()
    runner.current_status = RunnerReady()
    # The worker never sent this task: its supervisor fails on an acknowledgement of a
    # task it does not know (a KeyError that stops it), so none is sent.
    runner.acknowledge_task = lambda task: None
    _note("decoding")
    try:
        runner.handle_generation_tasks(task)
    except BaseException as error:
        import traceback

        where = traceback.format_exception(error)[-3:]
        _note("decode left", raised=type(error).__name__, where=where)
        raise
    _note("decode left", raised=None)


def _first(original: Callable[..., Any]) -> Callable[..., Any]:
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
            caller: Any = sys._getframe(1).f_locals.get("self")  # pyright: ignore
            match _MODE:
                case "eval":
                    _eval()
                case "decode" if caller is not None and hasattr(caller, "handle_generation_tasks"):
                    _decode(caller)
                case _:
                    pass
        return original(self, block, *args, **kwargs)

    return get


def _probe() -> None:
    import atexit

    atexit.register(_note, "atexit")


if _NOTES and "--multiprocessing-fork" in sys.orig_argv:
    import multiprocessing.queues
    import queue

    _probe()
    queue.Queue.get = _first(queue.Queue.get)  # pyright: ignore[reportAttributeAccessIssue]
    multiprocessing.queues.Queue.get = _first(  # pyright: ignore[reportAttributeAccessIssue]
        multiprocessing.queues.Queue.get  # pyright: ignore[reportUnknownMemberType]
    )
