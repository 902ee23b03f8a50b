"""`steps_site` for `tests/helpers/app_quit.py`, and two things more.

On PYTHONPATH instead of `steps_site` (which it loads, and which works as before):

- with `EOG_STEPS_MODE=gil` (the wedged runner), SIGTERM is ignored from the runner's
  start: a runner SIGTERM cannot end, as one inside a kernel call is on a Mac (state
  U) until the call returns. (`steps_site` blocks signals on the main thread only;
  a process-directed SIGTERM then kills it through another thread.)
- with `EOG_TERM_HANDOVER` set, an experiment, not the guard: what a runner would do
  if SIGTERM from its live worker asked for exo's own Shutdown instead of killing it
  (docs/exo.md, "EXO.app's quit"). In exo main's runner, at the first blocking `get`
  of `Runner.main` (right after RunnerIdle), a SIGTERM handler is installed that posts
  exo's `Shutdown` on the runner's own task stream with the guard's own hand-over
  (`exo_orphan_guard.exo.shutdown_task`). A Python handler runs only between
  bytecodes: a runner inside a long `mx.eval` takes it when the eval returns. The
  guard replaces the handler once the worker is gone.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

_STEPS = Path(__file__).resolve().parents[1] / "steps_site" / "sitecustomize.py"
_spec = importlib.util.spec_from_file_location("eog_steps_site", _STEPS)
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))


def _install_first(original: Callable[..., Any]) -> Callable[..., Any]:
    import multiprocessing
    import signal
    import sys
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
            runner: Any = sys._getframe(1).f_locals.get("self")  # pyright: ignore[reportPrivateUsage]
            if runner is not None and hasattr(runner, "task_receiver"):
                from exo_orphan_guard.exo.shutdown_task import ExoShutdown

                shutdown = ExoShutdown(runner.bound_instance, runner.task_receiver)

                def on_sigterm(signum: int, frame: object) -> None:
                    shutdown.post()

                signal.signal(signal.SIGTERM, on_sigterm)
        return original(self, block, *args, **kwargs)

    return get


if os.environ.get("EOG_STEPS_MODE") == "gil":
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)

if os.environ.get("EOG_TERM_HANDOVER"):
    import queue

    queue.Queue.get = _install_first(queue.Queue.get)  # pyright: ignore[reportAttributeAccessIssue]
