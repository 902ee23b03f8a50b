"""The backend: the module behind `system`'s one interface to the operating system.

`linux` reads /proc and calls prctl (auto on Linux). `portable` is psutil and the
standard library only: what macOS and the BSDs run, and what
`EXO_ORPHAN_GUARD_BACKEND=portable` forces on Linux so that CI runs the Mac's code.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Final, Literal

from . import settings
from .once import warn_once
from .process_facts import Pid

BackendName = Literal["linux", "portable"]

_choice = settings.parse_backend(os.environ.get(settings.BACKEND_ENV))
if _choice.warning is not None:
    warn_once(_choice.warning)

BACKEND: Final[BackendName] = (
    "linux" if sys.platform == "linux" and _choice.value == "auto" else "portable"
)

if BACKEND == "linux":
    from ._linux import (
        PIPES_VISIBLE,
        become_child_subreaper,
        boot_id,
        child_pids,
        environment_value,
        forked_by_main_thread,
        group_members,
        is_stopped,
        iter_command_lines,
        parent_pid,
        pipe_inodes,
        read_start,
        set_parent_death_signal,
        stuck_state,
    )
    from ._posix import (
        close_files_from,
        descendant_pids,
        hardware_uuid,
        memory_usage,
        wired_memory,
    )
elif sys.platform == "darwin":
    from ._darwin import (
        PIPES_VISIBLE,
        become_child_subreaper,
        boot_id,
        child_pids,
        close_files_from,
        descendant_pids,
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
else:
    from ._posix import (
        PIPES_VISIBLE,
        become_child_subreaper,
        boot_id,
        child_pids,
        close_files_from,
        descendant_pids,
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


def descendants(pid: int) -> list[Pid]:
    """Children, grandchildren, ...: each pid once, parents before their children."""
    if BACKEND == "portable":
        # One pass over the process table instead of one per process in the tree.
        return descendant_pids(pid)
    found: list[Pid] = []
    seen: set[int] = {pid}
    frontier = [pid]
    while frontier:
        next_frontier: list[int] = []
        for parent in frontier:
            for child in child_pids(parent):
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    next_frontier.append(child)
        frontier = next_frontier
    return found


def close_inherited_files(lowest: int) -> None:
    """Close every fd >= `lowest` without a close() per possible fd number where the OS
    allows: CPython's `closerange` is one close_range(2) call on Linux >= 5.9, while on
    macOS it loops over all 65,535 numbers of exo's soft limit."""
    if BACKEND == "portable":
        close_files_from(lowest)
        return
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    upper = soft_limit if soft_limit != resource.RLIM_INFINITY else 1 << 20
    os.closerange(lowest, min(upper, 1 << 20))


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
