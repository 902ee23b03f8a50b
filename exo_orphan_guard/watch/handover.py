"""The first step of a clean ending, where the program has one: its own Shutdown.

A runner whose program takes shutdown requests on a stream of its own (exo's runner
takes `Shutdown` tasks on its task stream, at its own safe points) ends best the way
its live worker would end it: the guard hands it that request and lets its own loop
take it. Only a runner that has not taken it within `HANDOVER_SECONDS` of its main
thread running Python gets the next step (`WorkerGone` on its main thread): a main
thread in native code (one long `mx.eval`) is busy, not refusing, and its window
starts when it comes back. The busy wait and the grace bound both, as for any
runner.

The heartbeat thread runs the step (`run_handover`), never the signal handler: the
hand-over goes through queues and locks that the interrupted code may hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

from loguru import logger

HANDOVER_SECONDS: Final = 2.0
"""How long a runner's own loop has to take the Shutdown handed to it before the guard
raises `WorkerGone` on its main thread. An idle exo runner takes it within
milliseconds and a decoding one at its next token; one loading weights or inside a
long prefill does not look until that is over, and is interrupted instead. Never more
than half the grace, so that the escalation leaves the other half."""
_LOOK_SECONDS: Final = 0.005
"""How often, within the window, the main thread's stack is looked at for the request:
exo's own shutdown takes far longer than this (events, a collection, the model's
release), so a taken request is seen."""


class Handover(Protocol):
    """What a program offers to end the way its worker would have ended it."""

    @property
    def name(self) -> str:
        """What is handed over, for the logs ("exo's Shutdown")."""
        ...

    def post(self) -> None:
        """Hand the request over. May block (a lock the dead worker held): it runs on
        a thread of its own. Raises whatever failed."""
        ...

    def taken(self) -> bool:
        """Whether the program's own code is handling the request now."""
        ...


def window(grace: float) -> float:
    return min(HANDOVER_SECONDS, grace / 2)


def run_handover(
    handover: Handover,
    grace: float,
    *,
    in_python_since: Callable[[], float | None],
    exiting: Callable[[], bool],
    on_taken: Callable[[], None],
    escalate: Callable[[str], None],
) -> None:
    """Post the request and watch the window, which opens when `in_python_since` (the
    `time.monotonic()` the main thread first ran Python after the notice) says: call
    `on_taken` as soon as the program's code has the request (then nothing else
    happens: its shutdown is never interrupted), or `escalate` with the reason if the
    window passes first. A request that cannot be posted (a closed stream) is said
    once; the window still runs, for a program that ends by itself."""
    failed: list[BaseException] = []

    def post() -> None:
        try:
            handover.post()
        except BaseException as error:  # said once, then the next step
            failed.append(error)

    poster = threading.Thread(target=post, name="exo-orphan-guard-handover", daemon=True)
    poster.start()
    said = False
    while True:
        if failed and not said:
            # Its task stream closed, say: the program's loop may be ending by itself,
            # and is given the window for it all the same.
            said = True
            error = failed[0]
            logger.warning(
                f"orphan guard: could not hand over {handover.name} "
                f"({type(error).__name__}: {error})"
            )
        if not failed and _taken(handover):
            on_taken()
            return
        if exiting():
            return
        since = in_python_since()
        if since is not None and time.monotonic() >= since + window(grace):
            if failed:
                escalate(f"{handover.name} could not be handed over")
            else:
                escalate(f"{handover.name} was not taken within {window(grace):g} s")
            return
        time.sleep(_LOOK_SECONDS)


def _taken(handover: Handover) -> bool:
    try:
        return handover.taken()
    except Exception:  # a look that fails says nothing: the window decides
        return False
