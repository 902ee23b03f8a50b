"""Runners shaped like exo main's, guarded by exo's own parent watch (`exo_tree/`).

The scenario worker's `exo` watch: the worker makes each runner an exo-shaped task
channel (`exo_shaped/exo`, put on `sys.path`, which spawned runners inherit). As exo
main's `Runner` does, an exo-shaped runner reads its task stream on a task-reader
thread into a queue of its own and takes its tasks from that queue; guarded, it
calls the PR's `exo.worker.runner.parent_watch.watch_parent(bound_instance,
work_queue.put)` first, as exo's patched `Runner.main` does: the very file the series
adds to exo, run against the exo-shaped types, and nothing of this package inside the
runner. Then it behaves (`behave`) and takes its tasks as exo's loop does: one at a
time, a `Shutdown` ends it after its own shutdown. The live worker sends each runner
exo's `Shutdown` once `<go_file>.shutdown` exists (`scenarios.ask_to_shut_down`), as
exo's worker stops a runner it no longer wants.
"""

from __future__ import annotations

import importlib
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

from ..exo.footprints import EXO_TREE, WATCH_MODULE
from . import native_calls
from .notes import RunnerNotes

EXO_SHAPED: Final = str(Path(__file__).resolve().parent / "exo_shaped")
IN_TREE_MODULE: Final = "exo.worker.runner.parent_watch"
IN_TREE_FILE: Final = EXO_TREE / WATCH_MODULE
OWN_SHUTDOWN_SECONDS: Final = 0.3
"""How long the runner's own shutdown takes once its loop took the Shutdown (unless
`OWN_SHUTDOWN_SECONDS_ENV`): long enough for the guard's looks to see it under way
(exo's takes about a second)."""
OWN_SHUTDOWN_SECONDS_ENV: Final = "EOG_EXO_OWN_SHUTDOWN_SECONDS"
LOAD_SECONDS_ENV: Final = "EOG_EXO_LOAD_SECONDS"
ExoKind = Literal["exoidle", "exoload", "exoeval", "exofull"]
"""exoidle: waits for its next task. exoload: first works in Python for
`EOG_EXO_LOAD_SECONDS` (default: for good) without looking at its tasks, as exo's
weight loading between layers does. exoeval: first one GIL-free native call of
`EOG_NATIVE_SECONDS`, as one long `mx.eval`, then waits for its next task. exofull:
as exoidle, but once it took its Shutdown it sends more on its event stream (a queue
only its worker reads) than the pipe holds, as a decoding runner's tokens pile up
once its worker is gone, and after its own shutdown it closes and joins that stream
as exo's bootstrap does last: with the worker gone, the join never returns."""
EVENT_FLOOD_BYTES: Final = 2**20
"""Far more than a pipe holds (64 KiB on Linux, at most that on macOS)."""


def use_exo_shaped() -> None:
    if EXO_SHAPED not in sys.path:
        sys.path.insert(0, EXO_SHAPED)


def channel_and_instance(runner_id: str) -> tuple[object, object, object]:
    """Worker side: a runner's bound instance, the receiving end of its task channel
    and the sending end of its event channel, as exo's `entrypoint` gets them (the
    worker keeps nothing else: its death leaves both channels to the runner)."""
    use_exo_shaped()
    channels = importlib.import_module("exo.utils.channels")
    instances = importlib.import_module("exo.shared.types.worker.instances")
    bound: object = instances.BoundInstance(instances.Instance("scenario"), runner_id)
    receiver: object = channels.MpReceiver(channels.MpState())
    events: object = channels.MpSender(channels.MpState())
    return bound, receiver, events


SENT: Final = "sent Shutdown"
"""The worker's note (in its own `<pid>.jsonl`) once every Shutdown is in the pipes."""


def shut_down_when_asked(go_file: str, exo_ends: Sequence[tuple[object, ...]], notes: str) -> None:
    """Worker side, while it lives: once `<go_file>.shutdown` exists
    (`scenarios.ask_to_shut_down`), a thread sends each runner (`channel_and_instance`)
    exo's `Shutdown`, as exo's worker stops a runner it no longer wants, then notes
    `SENT`."""

    def when_asked() -> None:
        while not os.path.exists(f"{go_file}.shutdown"):
            time.sleep(0.05)  # seldom: it runs in every exo-shaped worker, benchmarks' too
        for bound_instance, task_receiver, *_ in exo_ends:
            _send_shutdown(bound_instance, task_receiver)
        RunnerNotes(notes).write(SENT)

    threading.Thread(target=when_asked, name="shutdown-when-asked", daemon=True).start()


def _send_shutdown(bound_instance: object, task_receiver: object) -> None:
    """exo's `Shutdown` on the runner's task stream, sent over the same `MpState` as
    the runner's receiver, as exo's worker sends it."""
    channels = importlib.import_module("exo.utils.channels")
    tasks = importlib.import_module("exo.shared.types.tasks")
    instance: object = getattr(bound_instance, "instance")  # noqa: B009
    shutdown: object = tasks.Shutdown(
        instance_id=getattr(instance, "instance_id"),  # noqa: B009
        runner_id=getattr(bound_instance, "bound_runner_id"),  # noqa: B009
    )
    sender: object = channels.MpSender(getattr(task_receiver, "_state"))  # noqa: B009
    send: object = getattr(sender, "send")  # noqa: B009
    close: object = getattr(sender, "close")  # noqa: B009
    join: object = getattr(sender, "join")  # noqa: B009
    assert callable(send) and callable(close) and callable(join)
    send(shutdown)
    # The queue's feeder thread holds the stream's write lock, shared with the runner,
    # for a moment after the runner can read what it wrote: a test that SIGKILLs the
    # worker then would leave that lock held for good, and the runner's own feeder
    # (its guard's Shutdown) stuck on it. Joined, the feeder is done with it.
    close()
    join()


_work: dict[int, queue.Queue[object]] = {}
"""The runner's own task queue, by its task stream: one per runner process."""


def work_queue(task_receiver: object) -> queue.Queue[object]:
    """The runner's own task queue, fed from its task stream by a task-reader thread,
    as exo main's `Runner._start_task_reader` does (started on first use)."""
    if id(task_receiver) not in _work:
        work: queue.Queue[object] = queue.Queue()
        _work[id(task_receiver)] = work
        receive: object = getattr(task_receiver, "receive", None)
        assert callable(receive)

        def read() -> None:
            while True:
                work.put(receive())

        threading.Thread(target=read, name="task-reader", daemon=True).start()
    return _work[id(task_receiver)]


def guard(bound_instance: object, task_receiver: object) -> None:
    """What the PR puts first in exo's `Runner.main`."""
    use_exo_shaped()
    module = importlib.import_module(IN_TREE_MODULE)
    watch_parent: object = getattr(module, "watch_parent")  # noqa: B009
    assert callable(watch_parent)
    watch_parent(bound_instance, work_queue(task_receiver).put)


def behave(kind: str, note: RunnerNotes, task_receiver: object, event_sender: object) -> None:
    if kind == "exoload":
        note.write("loading")
        end = time.monotonic() + float(os.environ.get(LOAD_SECONDS_ENV, "inf"))
        while time.monotonic() < end:
            sum(range(10_000))
    if kind == "exoeval":
        native_calls.busy_in_native_code_letting_go_of_the_gil(note)
    tasks = importlib.import_module("exo.shared.types.tasks")
    work = work_queue(task_receiver)
    while True:
        task: object = work.get()
        note.write("took", task=type(task).__name__)
        if isinstance(task, tasks.Shutdown):
            if kind == "exofull":
                _flood(event_sender, note)
            time.sleep(float(os.environ.get(OWN_SHUTDOWN_SECONDS_ENV, OWN_SHUTDOWN_SECONDS)))
            note.write("shut down")
            if kind == "exofull":
                _close_and_join(event_sender, note)
            return


def _flood(event_sender: object, note: RunnerNotes) -> None:
    """Events nobody reads: `send` returns at once (the queue's feeder thread takes
    them), and the feeder blocks once the pipe is full."""
    send: object = getattr(event_sender, "send")  # noqa: B009
    assert callable(send)
    chunk = b"t" * 2**14
    for _ in range(EVENT_FLOOD_BYTES // len(chunk)):
        send(chunk)
    note.write("flooded", bytes=EVENT_FLOOD_BYTES)


def _close_and_join(event_sender: object, note: RunnerNotes) -> None:
    """exo's `entrypoint` ends with `event_sender.close()` and `event_sender.join()`:
    the join waits for the feeder thread, blocked on the full pipe to the dead worker."""
    close: object = getattr(event_sender, "close")  # noqa: B009
    join: object = getattr(event_sender, "join")  # noqa: B009
    assert callable(close) and callable(join)
    close()
    note.write("joining")
    join()
    note.write("joined")
