"""What a runner whose worker died does on its way out, however its ending began
(the notice handler, or the hand-over of its program's own Shutdown)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from types import FrameType

from ..system.identity import ProcessIdentity
from . import widowed
from .tree_kill import kill_strays

_prepared: list[ProcessIdentity] = []


def prepare(me: ProcessIdentity, worker: ProcessIdentity) -> None:
    """Nothing the dead worker held may stop the ending half-way; at exit, memory is
    handed back and strays go along. Once per process (either way in may come first)."""
    if _prepared:
        return
    _prepared.append(me)
    widowed.let_go_of(worker)
    atexit.register(release_memory)
    atexit.register(_take_strays_along, me)


def release_memory() -> None:
    """What the guard does last before a clean exit: collect, and hand MLX's cached
    buffers back (a no-op unless MLX is loaded)."""
    gc.collect()
    mlx = sys.modules.get("mlx.core")
    clear_cache = getattr(mlx, "clear_cache", None)
    if callable(clear_cache):
        with contextlib.suppress(Exception):
            clear_cache()


def _take_strays_along(me: ProcessIdentity) -> None:
    """At exit, what the runner started outside its group goes with it. Its watchdog
    may not have walked its tree yet (a runner that ends the clean way is often gone
    before its watchdog has noticed the worker's death), and once the runner has
    exited no walk finds them."""
    if os.getpgrp() != me.pid:
        return  # no group of its own: the watchdog kills every descendant it found
    with contextlib.suppress(Exception):
        kill_strays(me, me.pid)


def already_ending(signal_number: int, frame: FrameType | None) -> None:
    del signal_number, frame
