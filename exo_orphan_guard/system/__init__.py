"""One interface to the operating system; the module behind it is the backend.

`linux` reads /proc and calls prctl (auto on Linux). `portable` is psutil and the
standard library only: what macOS and the BSDs run, and what
`EXO_ORPHAN_GUARD_BACKEND=portable` forces on Linux so that CI runs the Mac's code.

The backend loads on first use (PEP 562): `settings`, `once` and `process_facts`
import without it, so `exo-orphan-guard --version` and the CLI's argument parsing start
without psutil.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .backend import (
        BACKEND,
        PIPES_VISIBLE,
        BackendName,
        become_child_subreaper,
        boot_id,
        child_pids,
        close_inherited_files,
        descendants,
        environment_value,
        forked_by_main_thread,
        group_members,
        hardware_uuid,
        is_stopped,
        iter_command_lines,
        memory_usage,
        parent_pid,
        pipe_inodes,
        read_start,
        set_parent_death_signal,
        stuck_state,
        wired_memory,
    )


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".backend", __name__), name)
    globals()[name] = value  # looked up here from now on, as a plain attribute
    return value


__all__ = [
    "BACKEND",
    "PIPES_VISIBLE",
    "BackendName",
    "become_child_subreaper",
    "boot_id",
    "child_pids",
    "close_inherited_files",
    "descendants",
    "environment_value",
    "forked_by_main_thread",
    "group_members",
    "hardware_uuid",
    "is_stopped",
    "iter_command_lines",
    "memory_usage",
    "parent_pid",
    "pipe_inodes",
    "read_start",
    "set_parent_death_signal",
    "stuck_state",
    "wired_memory",
]
