"""A runner that waits for its next task among threads, as exo main's `Runner` does.

exo main's runner blocks its main thread in `queue.Queue.get()`, fed by a task-reader
thread, beside threads of its libraries. A SIGINT that any thread but the main one
takes only sets CPython's flag: nothing wakes the main thread, and the runner sits on
until a SIGKILL. The helper threads wake every few milliseconds, so that a signal the
kernel leaves to whichever thread runs first (one sent while the process is stopped)
lands on one of them, not on the main thread.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Final

from .notes import RunnerNotes

HELPER_THREADS: Final = 3
WAITING: Final = "waiting for a task"


def wait_for_a_task_among_threads(note: RunnerNotes) -> None:
    tasks: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=_read_tasks, args=(tasks,), name="task-reader", daemon=True).start()
    for index in range(HELPER_THREADS):
        threading.Thread(target=_wake_often, name=f"helper-{index}", daemon=True).start()
    note.write(WAITING)
    tasks.get()


def _read_tasks(tasks: queue.Queue[bytes]) -> None:
    """Blocked in a read that no task ever ends, as a reader of a dead worker's pipe."""
    read_end, _write_end = os.pipe()
    tasks.put(os.read(read_end, 1))


def _wake_often() -> None:
    while True:
        time.sleep(0.002)
