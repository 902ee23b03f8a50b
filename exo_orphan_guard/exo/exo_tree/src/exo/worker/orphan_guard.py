"""Optional hooks into exo-orphan-guard: a runner ends when its worker dies.

A runner is a spawned child of the worker. When the worker is hard-killed (SIGKILL,
a crash, a force-quit), its runners live on with ppid 1, holding their memory and,
on multi-node instances, their RDMA queue pairs: the next runner on the node fails
with "[jaccl] Changing queue pair to RTR failed with errno 16".

With EXO_ORPHAN_GUARD=true and exo-orphan-guard installed (no edit needed:
`uv run --with exo-orphan-guard exo`), each runner watches its worker. When the
worker dies the runner gets, on its own task stream, the Shutdown a live worker
would send, and ends through its own loop; only a runner that cannot take it is
interrupted, and only one that cannot end at all is killed. Leftover runners of a
dead exo are swept when the worker starts and before a runner takes its first
task. Off by default; with the toggle on and the package missing, one warning.

The package reads its other settings once per process: EXO_ORPHAN_GUARD_GRACE
(seconds a runner gets to end cleanly, default 10), EXO_ORPHAN_GUARD_BUSY_WAIT
(seconds a runner busy in native code is waited for, default 120),
EXO_ORPHAN_GUARD_STRATEGY, EXO_ORPHAN_GUARD_BACKEND and EXO_ORPHAN_GUARD_DIR;
`exo-orphan-guard doctor` lists them with their values.
"""

import functools
import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import cast

from loguru import logger

from exo.shared.types.tasks import Task
from exo.shared.types.worker.instances import BoundInstance
from exo.utils.channels import MpReceiver

EXO_ORPHAN_GUARD = os.getenv("EXO_ORPHAN_GUARD", "false").lower() in ("true", "1")


@functools.cache
def _hooks() -> ModuleType | None:
    try:
        return importlib.import_module("exo_orphan_guard.exo.hooks")
    except ImportError:
        logger.warning(
            "EXO_ORPHAN_GUARD is on but exo-orphan-guard is not installed "
            "(uv run --with exo-orphan-guard exo): runners are not guarded"
        )
        return None


def _hook(name: str) -> object | None:
    hooks = _hooks() if EXO_ORPHAN_GUARD else None
    return None if hooks is None else cast(object, getattr(hooks, name))


def guard_runner(
    bound_instance: BoundInstance, task_receiver: MpReceiver[Task]
) -> None:
    """First in a runner: it ends when its worker dies, through its own Shutdown."""
    if (hook := _hook("guard_exo_runner")) is not None:
        cast(Callable[[BoundInstance, MpReceiver[Task]], None], hook)(
            bound_instance, task_receiver
        )


def guard_worker() -> None:
    """First in the worker: its runners know it, and leftovers are swept."""
    if (hook := _hook("guard_exo_worker")) is not None:
        cast(Callable[[], None], hook)()
