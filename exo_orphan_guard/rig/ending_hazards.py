"""What the stand-in runners whose clean ending meets a hazard do (`scenario_worker`):
the notice landing while a loguru sink's lock is held."""

from __future__ import annotations

import time
from typing import Final, NoReturn

from .notes import RunnerNotes

SLOW_SINK_SECONDS: Final = 0.005
"""How long the `slowsink` runner's sink takes to write a line: the main thread spends
nearly all its time inside the sink, holding its lock."""


def log_through_a_slow_sink(note: RunnerNotes) -> NoReturn:
    """Log one line after another through a sink of its own, added with `catch=False`
    (so that loguru's errors reach the caller) and slow to write: the notice lands
    while this thread holds the sink's lock. An error is noted and the loop goes on, as
    exo's runner reports a failed task and takes the next one: only WorkerGone, a
    BaseException, leaves the loop."""
    from loguru import logger

    logger.remove()
    logger.add(lambda _: time.sleep(SLOW_SINK_SECONDS), format="{message}", catch=False)
    note.write("logging")
    number = 0
    while True:
        number += 1
        try:
            logger.info(f"step {number}")
        except Exception as error:
            note.write("logging failed", type=type(error).__name__, detail=str(error))
