"""Asking psutil about another process: a value, "gone", or "unreadable now".

A sweep meets exiting processes above all, and psutil does not always say so with
`NoSuchProcess`: on macOS 7.2.1's `cmdline()` raises a bare `OSError` with errno 0
(psutil #2708) and 7.2.2's a `SystemError` ("<built-in function proc_cmdline>
returned a result with an exception set": `arch/osx/proc_utils.c` sets AccessDenied
and returns success, psutil #2854). Every read of another process goes through
`read`, so none of these can abort a sweep, and only "no such process" ever means
gone: whatever else went wrong says nothing about the process, and doubt spares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, final

import psutil

T = TypeVar("T")


@final
@dataclass(frozen=True, slots=True)
class Unread:
    """Why a detail of a process was not read."""

    gone: bool
    """psutil's NoSuchProcess (a zombie included) or ESRCH: the kernel no longer hands
    the process out. Not proof that it left the process table: on macOS a process
    that started exiting is refused before it is unlisted."""
    error: str


def read(call: Callable[[], T]) -> T | Unread:
    try:
        return call()
    except (psutil.NoSuchProcess, ProcessLookupError) as error:
        return Unread(gone=True, error=_describe(error))
    except (psutil.Error, OSError, SystemError) as error:
        return Unread(gone=False, error=_describe(error))


def read_or(call: Callable[[], T], default: T) -> T:
    """`call()`, or `default` if the process is gone or cannot be read now."""
    value = read(call)
    return default if isinstance(value, Unread) else value


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".rstrip(": ")
