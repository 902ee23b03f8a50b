"""The private names the guard leans on inside guarded processes, each where no public
one does the job (docs/reference.md, "Private names inside guarded processes"), checked
for what the guard needs of it. Each fails on the first library version that takes
the name away or changes what it does, naming it, before the real-process tests that
rely on it fail less clearly. Run on Python 3.11 and 3.13 (exo's) alike."""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import multiprocessing.util
import threading
import time
from typing import cast

import psutil
from loguru import logger

from exo_orphan_guard.watch import widowed


def test_loguru_enqueued_handlers_still_name_their_owner_and_emit() -> None:
    """`widowed.stop_widowed_log_queues`: a handler added with `enqueue=True` writes into
    a pipe read by a thread of the process that added it (`_owner_process_pid`); once
    that process is dead its `emit` must drop. loguru has no public way to ask a
    handler which process drains it, nor to remove handlers of an unpickled logger
    copy (exo's runner holds one) by that."""
    import loguru._handler as handler_module

    assert callable(getattr(handler_module.Handler, "emit", None)), "loguru Handler.emit"
    sink = logger.add(lambda message: None, enqueue=True)
    try:
        core: object = getattr(logger, "_core")  # noqa: B009  # loguru has no public one
        handler: object = cast(dict[int, object], getattr(core, "handlers"))[sink]  # noqa: B009
        assert isinstance(handler, handler_module.Handler)
        assert getattr(handler, "_enqueue", None) is True, "loguru Handler._enqueue"
        assert getattr(handler, "_owner_process_pid", None) == multiprocessing.current_process().pid
    finally:
        logger.remove(sink)


def test_queue_feeder_joins_are_still_finalizers_the_guard_can_cancel() -> None:
    """`widowed._skip_queue_joins`: at exit multiprocessing joins each queue's feeder
    thread, blocked for good on a full pipe the dead worker no longer reads. The
    public `Queue.cancel_join_thread()` needs the queue, and exo's and loguru's are
    out of reach; the joins are found in `util._finalizer_registry` by their callback,
    `Queue._finalize_join`. Here: a queue whose pipe nobody reads, cancelled that way,
    joins at once."""
    join = getattr(multiprocessing.queues.Queue, "_finalize_join", None)
    assert callable(join), "multiprocessing Queue._finalize_join"
    registry = getattr(multiprocessing.util, "_finalizer_registry", None)
    assert isinstance(registry, dict), "multiprocessing util._finalizer_registry"
    queue: multiprocessing.queues.Queue[bytes] = multiprocessing.get_context("spawn").Queue()
    for _ in range(64):
        queue.put(b"x" * 4096)  # more than the pipe holds: its feeder blocks
    time.sleep(0.1)
    widowed._skip_queue_joins()  # pyright: ignore[reportPrivateUsage]
    queue.close()
    joined = threading.Thread(target=queue.join_thread, daemon=True)
    joined.start()
    joined.join(2.0)
    assert not joined.is_alive(), "the feeder's join was not cancelled"
    # Its feeder stays blocked on the full pipe, a daemon thread: gone at exit.


def test_psutil_still_gives_the_raw_start_of_a_process() -> None:
    """`system._posix.raw_start`: psutil's own identity of a process uses its raw start
    (`_proc.create_time(monotonic=True)`, psutil >= 7.1); the public `create_time()`
    moves with the wall clock and the boot time psutil read."""
    raw = getattr(psutil.Process()._proc, "create_time", None)  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType, reportUnknownArgumentType, reportAttributeAccessIssue]
    assert callable(raw), f"psutil {psutil.__version__}: Process._proc.create_time"
    assert isinstance(raw(monotonic=True), float)
