"""`WorkerGone`: what a guarded runner's main thread gets when its worker dies.

Its own module, importing nothing, so that a guarded program can name the class at
import time without loading the guard.
"""

from __future__ import annotations


class WorkerGone(BaseException):
    """Raised once in a guarded runner's main thread when its worker is gone.

    A `BaseException`, like `SystemExit`: `except Exception` does not swallow it, so a
    runner that catches nothing still unwinds (its `finally` blocks run) and exits. A
    runner that catches it releases what it holds (its own shutdown) and returns.
    Either way it must exit within the grace (`EXO_ORPHAN_GUARD_GRACE`), or it is
    killed; before it exits the guard runs `gc.collect()` and, with MLX loaded,
    `mx.clear_cache()`.
    """
