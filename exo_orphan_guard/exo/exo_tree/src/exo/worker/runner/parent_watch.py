"""A runner whose worker dies takes the Shutdown a live worker would have sent.

A runner is a spawn child of the exo process that runs its worker. When exo is
hard-killed (SIGKILL, a crash, a force-quit), its runners keep running with ppid 1:
`daemon=True` acts only on a clean exit, and a runner waiting for its next task never
sees its task stream end, since it holds both ends of the pipe. Such a runner keeps
its model's memory and, on multi-node instances, its RDMA queue pairs.

With EXO_ORPHAN_GUARD on, the runner records itself for the worker's start-up sweep
(`runner_record`) and starts one daemon thread that waits on its worker's
multiprocessing sentinel, which is ready once the worker is gone, then hands the
runner `Shutdown` through `hand`. The caller picks `hand`: the runner's own
in-process task queue, so the hand-over takes no lock that the dead worker might
have held.
"""

import multiprocessing
import multiprocessing.connection
import threading
from collections.abc import Callable

import psutil

from exo.shared.constants import EXO_ORPHAN_GUARD, EXO_RUNNER_RECORDS_DIR
from exo.shared.types.tasks import Shutdown
from exo.shared.types.worker.instances import BoundInstance
from exo.worker.runner.bootstrap import logger
from exo.worker.runner.runner_record import record_runner


def watch_parent(
    bound_instance: BoundInstance, hand: Callable[[Shutdown], object]
) -> None:
    if not EXO_ORPHAN_GUARD:
        return
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        logger.warning("Runner has no multiprocessing parent to watch")
        return
    try:
        record_runner(EXO_RUNNER_RECORDS_DIR, parent.pid)
    except (OSError, psutil.Error) as e:
        logger.warning(f"Could not record runner for the start-up sweep: {e!r}")
    shutdown = Shutdown(
        instance_id=bound_instance.instance.instance_id,
        runner_id=bound_instance.bound_runner_id,
    )
    threading.Thread(
        target=_hand_shutdown_when_gone,
        args=(parent.sentinel, hand, shutdown),
        name="parent-watch",
        daemon=True,
    ).start()


def _hand_shutdown_when_gone(
    sentinel: int, hand: Callable[[Shutdown], object], shutdown: Shutdown
) -> None:
    multiprocessing.connection.wait([sentinel])
    # Nothing is logged here: the runner's log sinks forward to the dead worker.
    hand(shutdown)
