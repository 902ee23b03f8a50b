"""Runners shaped like exo's, guarded by exo's own hooks module (`exo_tree/`).

The scenario worker's `exo` watch: the worker makes each runner an exo-shaped task
channel (`exo_shaped/exo`, put on `sys.path`, which spawned runners inherit) and the
runner calls the series' `exo.worker.orphan_guard.guard_runner(bound_instance,
task_receiver)` first, as exo's patched `bootstrap.entrypoint` does: the very file
the series adds to exo, run against the exo-shaped types, and nothing of this
package inside the runner. Then it behaves (`behave`) and takes its tasks as exo's
loop does: one at a time, a `Shutdown` ends it after its own shutdown.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Final, Literal

from ..exo.placement import EXO_TREE
from . import native_calls
from .notes import RunnerNotes

EXO_SHAPED: Final = str(Path(__file__).resolve().parent / "exo_shaped")
IN_TREE_MODULE: Final = "exo.worker.orphan_guard"
IN_TREE_FILE: Final = EXO_TREE / "src" / "exo" / "worker" / "orphan_guard.py"
OWN_SHUTDOWN_SECONDS: Final = 0.3
"""How long the runner's own shutdown takes once its loop took the Shutdown (unless
`OWN_SHUTDOWN_SECONDS_ENV`): long enough for the guard's looks to see it under way
(exo's takes about a second)."""
OWN_SHUTDOWN_SECONDS_ENV: Final = "EOG_EXO_OWN_SHUTDOWN_SECONDS"
LOAD_SECONDS_ENV: Final = "EOG_EXO_LOAD_SECONDS"
ExoKind = Literal["exoidle", "exoload", "exoeval"]
"""exoidle: waits for its next task. exoload: first works in Python for
`EOG_EXO_LOAD_SECONDS` (default: for good) without looking at its tasks, as exo's
weight loading between layers does. exoeval: first one GIL-free native call of
`EOG_NATIVE_SECONDS`, as one long `mx.eval`, then waits for its next task."""
EXO_KINDS: Final[frozenset[str]] = frozenset({"exoidle", "exoload", "exoeval"})


def use_exo_shaped() -> None:
    if EXO_SHAPED not in sys.path:
        sys.path.insert(0, EXO_SHAPED)


def channel_and_instance(runner_id: str) -> tuple[object, object]:
    """Worker side: a runner's bound instance and the receiving end of its task
    channel (the worker keeps nothing else: its death leaves the channel to them)."""
    use_exo_shaped()
    channels = importlib.import_module("exo.utils.channels")
    instances = importlib.import_module("exo.shared.types.worker.instances")
    bound: object = instances.BoundInstance(instances.Instance("scenario"), runner_id)
    receiver: object = channels.MpReceiver(channels.MpState())
    return bound, receiver


def guard(bound_instance: object, task_receiver: object) -> None:
    use_exo_shaped()
    spec = importlib.util.spec_from_file_location(IN_TREE_MODULE, IN_TREE_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[IN_TREE_MODULE] = module
    spec.loader.exec_module(module)
    guard_runner: object = getattr(module, "guard_runner")  # noqa: B009
    assert callable(guard_runner)
    guard_runner(bound_instance, task_receiver)


def behave(kind: str, note: RunnerNotes, task_receiver: object) -> None:
    if kind == "exoload":
        note.write("loading")
        end = time.monotonic() + float(os.environ.get(LOAD_SECONDS_ENV, "inf"))
        while time.monotonic() < end:
            sum(range(10_000))
    if kind == "exoeval":
        native_calls.busy_in_native_code_letting_go_of_the_gil(note)
    tasks = importlib.import_module("exo.shared.types.tasks")
    receive: object = getattr(task_receiver, "receive", None)
    assert callable(receive)
    while True:
        task: object = receive()
        note.write("took", task=type(task).__name__)
        if isinstance(task, tasks.Shutdown):
            time.sleep(float(os.environ.get(OWN_SHUTDOWN_SECONDS_ENV, OWN_SHUTDOWN_SECONDS)))
            note.write("shut down")
            return
