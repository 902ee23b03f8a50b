"""SIGTERM from a live worker, to a runner with a Shutdown of its own: that Shutdown.

exo stops a runner it no longer wants (its own shutdown, EXO.app's quit) by joining it
for a few seconds and then SIGTERMing it: a hard end of a runner that was only busy,
or only never told (exo main's supervisor closes the task stream after the SIGTERM).
A guarded exo runner takes that SIGTERM as a request for its own Shutdown, handed
over as when the worker dies (`handover`): exo's loop takes it and the runner ends
through `Runner.shutdown`. One whose loop has not taken it within the window gets
SIGTERM's default action after all, as exo meant; one whose main thread is in native
code runs the handler only when the call returns, and exo's own SIGKILL (or, once the
worker is gone, the busy wait) bounds it meanwhile. Once the worker is gone, the
ending's own SIGTERM handler (`ending_exit.already_ending`) takes over.

The handler only writes a byte; a thread started beforehand does the rest (the
hand-over takes locks the interrupted code may hold).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from loguru import logger

from .handover import Handover, run_handover


def install(handover: Handover, grace: float, me: int, ending_begun: Callable[[], bool]) -> None:
    """Main thread only (a signal handler). `ending_begun`: whether the worker's death
    has begun the runner's ending, which then owns it (and its watchdog bounds it)."""
    wake, woken = os.pipe()
    os.set_blocking(woken, False)

    def on_sigterm(signal_number: int, frame: FrameType | None) -> None:
        del signal_number, frame
        with contextlib.suppress(OSError):
            os.write(woken, b"t")

    threading.Thread(
        target=_serve,
        args=(handover, grace, me, wake, ending_begun),
        name="exo-orphan-guard-term",
        daemon=True,
    ).start()
    signal.signal(signal.SIGTERM, on_sigterm)


def _serve(
    handover: Handover, grace: float, me: int, wake: int, ending_begun: Callable[[], bool]
) -> None:
    try:
        if not os.read(wake, 1):
            return
    except OSError:
        return
    asked = time.monotonic()
    logger.warning(
        f"orphan guard: runner {me}: SIGTERM from its worker: handing it {handover.name} first"
    )

    def taken() -> None:
        logger.warning(f"orphan guard: runner {me}: it took {handover.name} and is ending")

    def escalate(why: str) -> None:
        if ending_begun():
            return  # the worker died meanwhile: its clean ending, bounded, goes on
        logger.warning(f"orphan guard: runner {me}: {why}: ended as SIGTERM would have")
        # SIGTERM's default action, which only the main thread could put back: the
        # process ends at once, with no clean-up, as exo's SIGTERM meant.
        os.kill(os.getpid(), signal.SIGKILL)

    run_handover(
        handover,
        grace,
        in_python_since=lambda: asked,
        exiting=lambda: not threading.main_thread().is_alive(),
        on_taken=taken,
        escalate=escalate,
    )
