"""Worker-side hooks: what exo's main process calls."""

from __future__ import annotations

import os

from loguru import logger

from ._logging import warn_once
from .identity import current_identity
from .settings import WORKER_ENV, guard_enabled


def prepare_worker() -> None:
    """Record this process as the worker its runners must die with.

    Call once in the worker before it spawns runners (more calls are harmless). The
    identity (pid and start stamp) goes into the environment, which every runner
    inherits at spawn, so a runner that starts after its worker died still knows
    whom it belonged to. A no-op unless EXO_ORPHAN_GUARD is on; never raises.
    """
    toggle = guard_enabled()
    if toggle.warning is not None:
        warn_once(toggle.warning)
    if not toggle.value:
        return
    try:
        os.environ[WORKER_ENV] = current_identity().encode()
    except Exception as error:  # the guard must never break exo's start-up
        logger.opt(exception=error).warning("orphan guard: could not record the worker")
