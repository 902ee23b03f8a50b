"""Any POSIX system, through psutil: macOS, the BSDs, and what Linux does not do faster.

Same function names as `_linux`; `system` picks one module per platform.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from functools import cache
from typing import Final

import psutil

from ._common import Pid, ProcessStart

PIPES_VISIBLE: Final = False


def read_start(pid: int) -> ProcessStart | None:
    """None once the process is gone or a zombie psutil can no longer read.

    Raises PermissionError for a process that exists but cannot be read: callers must
    not mistake it for a dead one.
    """
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            return ProcessStart(process.create_time(), process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied as error:
        raise PermissionError(f"cannot read process {pid}") from error


def parent_pid(pid: int) -> int | None:
    """None once gone; PermissionError if unreadable."""
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied as error:
        raise PermissionError(f"cannot read process {pid}") from error


@cache
def boot_id() -> str:
    # No boot id outside Linux; boot time identifies the boot as well.
    return f"boot-{psutil.boot_time():.0f}"


def forked_by_main_thread(parent: int, child: int) -> bool | None:
    del parent, child
    return None


def set_parent_death_signal(signal_number: int) -> bool:
    del signal_number
    return False


def become_child_subreaper() -> bool:
    return False


def child_pids(pid: int) -> list[Pid]:
    try:
        return [Pid(child.pid) for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def stuck_state(pid: int) -> str | None:
    try:
        return "D" if psutil.Process(pid).status() == psutil.STATUS_DISK_SLEEP else None
    except psutil.Error:
        return None


def is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def pipe_inodes(pid: int) -> frozenset[int] | None:
    """Not visible through psutil: the sweep then never tells a spawner by its pipes."""
    del pid
    return None


def environment_value(pid: int, name: str) -> str | None:
    """Another process's environment cannot be read here (macOS hides it since Big
    Sur), so no claim can rest on it."""
    del name
    raise PermissionError(f"cannot read the environment of process {pid} here")


def group_members(groups: Collection[int]) -> list[Pid]:
    found: list[Pid] = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) in groups:
                found.append(Pid(pid))
        except OSError:
            continue
    return found


def iter_command_lines() -> Iterator[tuple[Pid, bytes]]:
    for process in psutil.process_iter():
        try:
            argv = process.cmdline()
        except (psutil.Error, OSError):  # psutil 7.2.1 on macOS: a bare OSError (#2708)
            continue
        if argv:
            yield Pid(process.pid), "\0".join(argv).encode() + b"\0"
