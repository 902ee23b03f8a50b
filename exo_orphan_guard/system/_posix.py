"""Any POSIX system, through psutil: macOS, the BSDs, and what Linux does not do faster.

Same function names as `_linux`; `system` picks one module per platform.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Collection, Iterator
from functools import cache
from typing import cast

import psutil

from .once import warn_once
from .process_facts import MemoryUsage, Pid, ProcessStart

PIPES_VISIBLE = False


def read_start(pid: int) -> ProcessStart | None:
    """None once the process is gone or a zombie psutil can no longer read.

    Raises PermissionError for a process that exists but cannot be read: callers must
    not mistake it for a dead one.
    """
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            return ProcessStart(raw_start(process), process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied as error:
        raise PermissionError(f"cannot read process {pid}") from error


def raw_start(process: psutil.Process) -> float:
    """The start the kernel stored at fork, which no clock step or boot-time re-read moves.

    `create_time()` adds a freshly read boot time on Linux and, on macOS (psutil >= 7.1),
    the change in `kern.boottime` since *this* process imported psutil: two processes
    can then disagree about one pid by a second. psutil's own process identity uses the
    raw value (`_proc.create_time(monotonic=True)`, psutil >= 7.1 on Linux, macOS and
    NetBSD): seconds since boot on Linux, `kp_proc.p_starttime` on macOS.
    """
    raw = cast(
        "Callable[..., float] | None",
        getattr(process._proc, "create_time", None),  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType, reportUnknownArgumentType, reportAttributeAccessIssue]
    )
    if raw is not None:
        try:
            return float(raw(monotonic=True))
        except TypeError:
            pass
    warn_once(
        f"orphan guard: psutil {psutil.__version__} has no raw process start here: "
        "identities follow the wall clock"
    )
    return process.create_time()


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
    """The kernel's id of this boot, never derived from a clock.

    On Linux the portable backend reads the kernel's boot id file (the counterpart of
    macOS's `kern.bootsessionuuid`; psutil offers no boot id). Elsewhere (the BSDs)
    only the boot time is left.
    """
    if sys.platform == "linux":
        with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip()
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


def descendant_pids(pid: int) -> list[Pid]:
    """The whole tree from one ppid map: on macOS each `children()` call scans every pid."""
    try:
        return [Pid(child.pid) for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def close_files_from(lowest: int, fd_dir: str = "/dev/fd") -> None:
    """Close the open fds >= `lowest`, listed from `fd_dir`: a few close() calls instead
    of `closerange`'s one per possible number (65,535 at exo's soft limit on macOS)."""
    try:
        # The listing's own fd is closed again by the time the list is returned.
        open_fds = [int(name) for name in os.listdir(fd_dir) if name.isdigit()]
    except OSError:
        os.closerange(lowest, 1 << 16)
        return
    for fd in open_fds:
        if fd >= lowest:
            with contextlib.suppress(OSError):
                os.close(fd)


def memory_usage(pid: int) -> MemoryUsage | None:
    """Resident set size: what the OS charges a process for outside macOS."""
    try:
        return MemoryUsage("rss", psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


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
