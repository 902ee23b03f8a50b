"""Optional orphan guard: a runner ends, through its own Shutdown, when its worker dies.

A runner is a spawned child of the worker. When the worker is hard-killed (SIGKILL,
a crash, a force-quit), its runners live on with ppid 1, holding their memory and,
on multi-node instances, their RDMA queue pairs: the next runner on the node fails
with "[jaccl] Changing queue pair to RTR failed with errno 16".

With EXO_ORPHAN_GUARD=true, each runner starts one daemon thread that waits for its
worker's exit (multiprocessing's parent sentinel) and then puts on the runner's own
task stream the Shutdown a live worker would send: the runner's loop takes it at its
own safe points (idle, or between two decode steps) and `Runner.shutdown` ends it.
Nothing else in the runner changes: no signal handler, no process group, no child
process, nothing patched. Standard library and exo's own code only; off by default.

The worker, before its plan loop starts, leaves a hand-over marker
(`<dir>/handover/<pid>.json`, in EXO_CACHE_HOME) for a guardian outside exo
(exo-orphan-guard's `service run`), which then gives such runners their grace before
it ends them itself, and, if the exo-orphan-guard package is installed, awaits its
sweep for leftover runners of a dead exo, off the event loop, so that no new runner
meets an orphan still holding the node's memory or ports. A failure anywhere here is
one warning, and exo runs on unguarded.
"""

import importlib
import json
import multiprocessing
import multiprocessing.connection
import os
import tempfile
import threading
import time
from pathlib import Path

from anyio import to_thread
from loguru import logger

from exo.shared.constants import EXO_CACHE_HOME, EXO_ORPHAN_GUARD
from exo.shared.types.tasks import Shutdown, Task
from exo.shared.types.worker.instances import BoundInstance
from exo.utils.channels import MpReceiver, MpSender

PACKAGE = "exo_orphan_guard"
PACKAGE_HOOKS = "exo_orphan_guard.exo.hooks"


def guard_runner(
    bound_instance: BoundInstance, task_receiver: MpReceiver[Task]
) -> None:
    """First in a runner: when its worker dies, it is handed its own Shutdown."""
    if not EXO_ORPHAN_GUARD:
        return
    try:
        parent = multiprocessing.parent_process()
        if parent is None:
            raise RuntimeError("not started by a worker (no multiprocessing parent)")
        shutdown = Shutdown(
            instance_id=bound_instance.instance.instance_id,
            runner_id=bound_instance.bound_runner_id,
        )
        # Both ends of the task stream are one MpState; exo's Mp channels have no
        # clone_sender, so the runner's own sender is made from its receiver's state.
        sender = MpSender[Task](_state=task_receiver._state)  # pyright: ignore[reportPrivateUsage]
        threading.Thread(
            target=_shutdown_when_gone,
            args=(parent.sentinel, sender, shutdown),
            name="exo-orphan-guard",
            daemon=True,
        ).start()
    except Exception as error:  # noqa: BLE001
        logger.warning(f"orphan guard: this runner is not guarded ({error!r})")


def _shutdown_when_gone(
    sentinel: int, sender: MpSender[Task], shutdown: Shutdown
) -> None:
    # No logging before the send: a log sink queued to the dead worker (enqueue=True)
    # blocks once its pipe is full.
    try:
        multiprocessing.connection.wait([sentinel])
        sender.send(shutdown)
    except Exception as error:  # noqa: BLE001
        logger.warning(f"orphan guard: could not hand this runner Shutdown ({error!r})")


async def guard_worker() -> None:
    """First in the worker's plan loop: a marker for the guardian, and the package's
    sweep, awaited on a thread while the node's other tasks run on."""
    if not EXO_ORPHAN_GUARD:
        return
    await to_thread.run_sync(_guard_worker, abandon_on_cancel=True)


def _guard_worker() -> None:
    try:
        _write_handover_marker()
    except Exception as error:  # noqa: BLE001
        logger.warning(
            f"orphan guard: could not write the hand-over marker ({error!r})"
        )
    try:
        try:
            hooks = importlib.import_module(PACKAGE_HOOKS)
        except ModuleNotFoundError as error:
            if error.name == PACKAGE:
                return  # not installed: the runners guard themselves all the same
            raise
        hook: object = getattr(hooks, "guard_exo_worker", None)
        if not callable(hook):
            raise TypeError(f"{PACKAGE_HOOKS} has no guard_exo_worker")
        hook()
    except Exception as error:  # noqa: BLE001
        logger.warning(f"orphan guard: the exo-orphan-guard package failed ({error!r})")


def _guard_dir() -> Path:
    override = os.getenv("EXO_ORPHAN_GUARD_DIR", "").strip()
    if override:
        return Path(override).expanduser()
    return EXO_CACHE_HOME / "orphan-guard"


def _write_handover_marker() -> None:
    """`<dir>/handover/<pid>.json`: this worker's runners hand themselves Shutdown."""
    base = _guard_dir()
    base.parent.mkdir(parents=True, exist_ok=True)
    handover = base / "handover"
    for directory in (base, handover):
        directory.mkdir(mode=0o700, exist_ok=True)
    marker = json.dumps({"pid": os.getpid(), "at": time.time()})
    fd, temporary = tempfile.mkstemp(dir=handover, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(marker)
        os.replace(temporary, handover / f"{os.getpid()}.json")
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
