"""The backend: which module answers each call of `system`'s interface.

`linux` reads /proc and calls prctl (auto on Linux). `portable` is psutil and the
standard library only: what macOS and the BSDs run, and what
`EXO_ORPHAN_GUARD_BACKEND=portable` forces on Linux so that CI runs the Mac's code.

One fallback chain per backend: `_posix` defines every call; `_linux` (the linux
backend) and `_darwin` (the portable backend on macOS) define only the calls they
answer better, and are asked first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Final

from . import BackendName, _posix, settings
from .once import warn_once

_choice = settings.parse_backend(os.environ.get(settings.BACKEND_ENV))
if _choice.warning is not None:
    warn_once(_choice.warning)

BACKEND: Final[BackendName] = (
    "linux" if sys.platform == "linux" and _choice.value == "auto" else "portable"
)


def _chain() -> tuple[ModuleType, ...]:
    if BACKEND == "linux":
        from . import _linux, _linux_state

        return (_linux, _linux_state, _posix)
    if sys.platform == "darwin":
        from . import _darwin

        return (_darwin, _posix)
    return (_posix,)


CHAIN: Final = _chain()


def implementation(name: str, chain: tuple[ModuleType, ...] = CHAIN) -> Callable[..., object]:
    """The function that answers `name`: the first in the chain that defines it (a
    module's own function, never one it merely imported)."""
    for module in chain:
        found: object = module.__dict__.get(name)
        if callable(found) and getattr(found, "__module__", None) == module.__name__:
            return found
    raise AttributeError(f"no {BACKEND} backend module defines {name!r}")
