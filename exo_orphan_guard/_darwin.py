"""macOS: psutil for everything, plus `ps` for the one state psutil cannot see.

Run on macOS by operators (`exo-orphan-guard selftest`), not by this project's CI:
keep it this small, and keep its parsing in pure functions that tests feed by hand.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

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
)

__all__ = [
    "PIPES_VISIBLE",
    "become_child_subreaper",
    "boot_id",
    "child_pids",
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
    "stuck_state_from_ps",
]


def stuck_state_from_ps(stat_column: str) -> str | None:
    """`U` (uninterruptible wait) or `D` from `ps -o stat=` output, else None.

    psutil maps macOS states from `kinfo_proc.p_stat`, which has no such state; the
    flag only shows in ps's STAT column (e.g. `Us+`), where ranks stuck in the RDMA
    driver sit and ignore SIGKILL.
    """
    flags = stat_column.strip()
    if not flags:
        return None
    return flags[0] if flags[0] in ("U", "D") else None


def stuck_state(pid: int, run_ps: Callable[[int], str] | None = None) -> str | None:
    return stuck_state_from_ps((run_ps or _ps_stat)(pid))


def _ps_stat(pid: int) -> str:
    try:
        completed = subprocess.run(
            ["/bin/ps", "-o", "stat=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return completed.stdout
