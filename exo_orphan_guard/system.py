"""One interface to the operating system; the module behind it depends on the platform."""

from __future__ import annotations

import sys

if sys.platform == "linux":
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
elif sys.platform == "darwin":
    from ._darwin import (
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
else:
    from ._posix import (
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

from ._common import Pid


def descendants(pid: int) -> list[Pid]:
    """Children, grandchildren, ...: breadth first, each pid once."""
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


__all__ = [
    "PIPES_VISIBLE",
    "become_child_subreaper",
    "boot_id",
    "child_pids",
    "descendants",
    "environment_value",
    "forked_by_main_thread",
    "group_members",
    "is_stopped",
    "iter_command_lines",
    "parent_pid",
    "pipe_inodes",
    "read_start",
    "set_parent_death_signal",
    "stuck_state",
]
