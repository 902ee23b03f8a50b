"""exo-orphan-guard's part inside exo's worker, where the package is installed: a
local patch on top of exo's own guard, never sent to exo.

Before the worker's plan loop, the package sweeps for leftover runners that no record
names (of an exo without the guard, EXO.app's among them), then makes sure one of its
guardians runs outside exo and writes the hand-over marker the guardian reads. It
runs on a daemon thread: exo's plan loop waits for it, exo's stop does not. Without
the package, or with EXO_ORPHAN_GUARD off, it does nothing; a failure is one warning.
"""

import importlib
import threading
from collections.abc import Callable
from typing import cast

import anyio
from loguru import logger

from exo.shared.constants import EXO_ORPHAN_GUARD, LEFTOVER_RUNNER_POLL_SECONDS

PACKAGE = "exo_orphan_guard"
PACKAGE_HOOKS = "exo_orphan_guard.exo.hooks"


async def guard_worker() -> None:
    if not EXO_ORPHAN_GUARD:
        return
    try:
        hooks = importlib.import_module(PACKAGE_HOOKS)
    except ModuleNotFoundError as e:
        if e.name != PACKAGE:
            logger.warning(f"exo-orphan-guard cannot be loaded: {e!r}")
        return
    hook: object = getattr(hooks, "guard_exo_worker", None)
    if not callable(hook):
        logger.warning(f"{PACKAGE_HOOKS} has no guard_exo_worker: versions differ")
        return
    done = threading.Event()
    threading.Thread(
        target=_run,
        args=(cast(Callable[[], object], hook), done),
        name="exo-orphan-guard",
        daemon=True,
    ).start()
    while not done.is_set():
        await anyio.sleep(LEFTOVER_RUNNER_POLL_SECONDS)


def _run(hook: Callable[[], object], done: threading.Event) -> None:
    try:
        hook()
    except Exception as e:
        logger.opt(exception=e).warning("exo-orphan-guard failed")
    finally:
        done.set()
