"""One interface to the operating system; the module behind it depends on the platform."""

from __future__ import annotations

import sys

if sys.platform == "linux":
    from ._linux import (
        become_child_subreaper,
        boot_id,
        child_pids,
        forked_by_main_thread,
        group_members,
        iter_command_lines,
        parent_pid,
        read_start,
        set_parent_death_signal,
        stuck_state,
    )
elif sys.platform == "darwin":
    from ._darwin import (
        become_child_subreaper,
        boot_id,
        child_pids,
        forked_by_main_thread,
        group_members,
        iter_command_lines,
        parent_pid,
        read_start,
        set_parent_death_signal,
        stuck_state,
    )
else:
    from ._posix import (
        become_child_subreaper,
        boot_id,
        child_pids,
        forked_by_main_thread,
        group_members,
        iter_command_lines,
        parent_pid,
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
    "become_child_subreaper",
    "boot_id",
    "child_pids",
    "descendants",
    "forked_by_main_thread",
    "group_members",
    "iter_command_lines",
    "parent_pid",
    "read_start",
    "set_parent_death_signal",
    "stuck_state",
]
