"""Any POSIX system, through psutil: macOS, the BSDs, and what Linux does not do faster.

Every name of `system`'s interface is here: the portable backend is this module
alone, and `_linux` and `_darwin` replace only what they do better (`backend`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Collection, Iterator
from functools import cache
from typing import TypeVar, cast

import psutil

from .once import warn_once
from .process_facts import (
    CreationMark,
    MemoryUsage,
    Pid,
    ProcessDetails,
    ProcessStart,
    ProcessState,
    Stamp,
    WiredMemory,
)
from .process_read import Unread, read, read_or

T = TypeVar("T")


def pipes_visible() -> bool:
    return False


def read_start(pid: int) -> ProcessStart | None:
    """None once the process is gone or a zombie psutil can no longer read.

    Raises PermissionError for a process that exists but cannot be read: callers must
    not mistake it for a dead one.
    """

    def start() -> ProcessStart:
        process = psutil.Process(pid)
        with process.oneshot():
            return ProcessStart(raw_start(process), process.status() == psutil.STATUS_ZOMBIE)

    return _known(pid, read(start))


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
    return _known(pid, read(lambda: psutil.Process(pid).ppid()))


def _known(pid: int, value: T | Unread) -> T | None:
    """None for a process that is gone; PermissionError for one that cannot be read."""
    if not isinstance(value, Unread):
        return value
    if value.gone:
        return None
    raise PermissionError(f"cannot read process {pid} ({value.error})")


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


def hardware_uuid() -> str | None:
    """None: outside macOS records keep their hostname, pid namespace and machine-id key."""
    return None


def wired_memory() -> WiredMemory | str | None:
    """None: memory stranded by hard-killed GPU processes is a macOS matter, measured
    by `_darwin` only."""
    return None


def forked_by_main_thread(parent: int, child: int) -> bool | None:
    del parent, child
    return None


def set_parent_death_signal(signal_number: int) -> bool:
    del signal_number
    return False


def become_child_subreaper() -> bool:
    return False


def child_pids(pid: int) -> list[Pid]:
    return read_or(lambda: [Pid(child.pid) for child in psutil.Process(pid).children()], [])


def descendants(pid: int) -> list[Pid]:
    """The whole tree from one ppid map: on macOS each `children()` call scans every pid."""
    return read_or(
        lambda: [Pid(child.pid) for child in psutil.Process(pid).children(recursive=True)], []
    )


def thread_blocks_signal(thread: int, signal_number: int) -> bool | None:
    """Only a thread's own mask is readable here (`pthread_sigmask`)."""
    return None


def ignores_signal(pid: int, signal_number: int) -> bool | None:
    """Not readable through psutil (nor, on macOS, through libproc)."""
    return None


def close_inherited_files(lowest: int, fd_dir: str = "/dev/fd") -> None:
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
    return read_or(lambda: MemoryUsage("rss", psutil.Process(pid).memory_info().rss), None)


def stuck_state(pid: int) -> str | None:
    status = read_or(lambda: psutil.Process(pid).status(), None)
    return "D" if status == psutil.STATUS_DISK_SLEEP else None


def is_exiting(pid: int) -> bool | None:
    """psutil cannot tell a process tearing itself down from one that runs."""
    del pid
    return None


def is_stopped(pid: int) -> bool | None:
    status = read_or(lambda: psutil.Process(pid).status(), None)
    return None if status is None else status == psutil.STATUS_STOPPED


def pipe_inodes(pid: int) -> frozenset[int] | None:
    """Not visible through psutil: the sweep then never tells a spawner by its pipes."""
    del pid
    return None


def mapped_files(pid: int) -> frozenset[str] | None:
    """psutil's memory maps where it has them (Linux, the BSDs); macOS, where it has
    none, reads libproc (`_darwin`)."""
    if not hasattr(psutil.Process, "memory_maps"):
        return None

    def paths() -> frozenset[str]:
        regions = psutil.Process(pid).memory_maps(grouped=True)
        return frozenset(region.path for region in regions if region.path.startswith("/"))

    return read_or(paths, None)


def environment_value(pid: int, name: str) -> str | None:
    """Another process's environment cannot be read here (macOS hides it since Big
    Sur), so no claim can rest on it."""
    del name
    raise PermissionError(f"cannot read the environment of process {pid} here")


def process_group(pid: int) -> int | None:
    return read_or(lambda: os.getpgid(pid), None)


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
    """Every process's NUL-separated argv; an empty one for a process whose command line
    vanished while the process table still lists it (on macOS: exiting, or stuck in the
    kernel on its way out), so that the snapshot keeps what it cannot name."""
    for process in psutil.process_iter():
        data = _command_line_of(process)
        if data is not None:
            yield Pid(process.pid), data


def command_line(pid: int) -> bytes | None:
    process = read(lambda: psutil.Process(pid))
    if isinstance(process, Unread):
        return None
    return _command_line_of(process)


def _command_line_of(process: psutil.Process) -> bytes | None:
    argv = read(process.cmdline)
    if isinstance(argv, Unread):
        return b"" if argv.gone and _still_listed(process.pid) else None
    return "\0".join(argv).encode() + b"\0" if argv else None


def list_processes() -> dict[Pid, Stamp | None]:
    """No stamps: psutil's listing is pids alone (the cheap pass then reads each)."""
    return dict.fromkeys(map(Pid, read_or(psutil.pids, [])))


def processes_among(pids: Collection[int]) -> dict[Pid, Stamp | None]:
    """psutil tells a Linux thread's id from a process's."""
    return {Pid(pid): None for pid in pids if _exists(pid)}


def stamp_of(pid: int) -> Stamp | None:
    """psutil's listing has no stamps."""
    del pid
    return None


def _exists(pid: int) -> bool:
    return read_or(lambda: psutil.pid_exists(pid), False)


def creation_mark() -> CreationMark | None:
    """Not readable through psutil: every scan then lists every process."""
    return None


def _still_listed(pid: int) -> bool:
    """Whether the process table still lists `pid` as a live (not zombie) process."""
    try:
        start = read_start(pid)
    except PermissionError:
        return False
    return start is not None and not start.exited


def process_details(pid: int) -> ProcessDetails | None:
    """None if psutil says no such process; PermissionError if it cannot be read."""
    process = _known(pid, read(lambda: psutil.Process(pid)))
    if process is None:
        return None
    with process.oneshot():
        listed = read(
            lambda: (
                process.ppid(),
                process.uids().effective,
                process.status(),
                process.create_time(),
            )
        )
        argv = read(process.cmdline)
        exe = read(process.exe)
        rss = read(lambda: process.memory_info().rss)
    pgid = read(lambda: os.getpgid(pid))
    known = _known(pid, listed)
    if known is None:
        return None
    ppid, uid, status, create_time = known
    return ProcessDetails(
        ppid=ppid,
        uid=uid,
        status=status,
        create_time=create_time,
        argv=None if isinstance(argv, Unread) else tuple(argv),
        exe=None if isinstance(exe, Unread) else exe or None,
        rss=None if isinstance(rss, Unread) else rss,
        pgid=None if isinstance(pgid, Unread) else pgid,
        refused=any(
            isinstance(detail, Unread) and detail.gone for detail in (argv, exe, rss, pgid)
        ),
    )


def process_state(pid: int) -> ProcessState | None:
    """Through psutil, `image` being the executable and command line; None if any of it
    could not be read."""

    def state() -> ProcessState:
        process = psutil.Process(pid)
        with process.oneshot():
            status = process.status()
            exited = status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
            start = ProcessStart(raw_start(process), exited)
            ppid = process.ppid()
            image = (process.exe(), tuple(process.cmdline()))
        return ProcessState(
            start=start,
            ppid=ppid,
            status=status,
            pgid=os.getpgid(pid),
            rss=None,
            memory=None,
            image=None if exited or not image[1] else image,
        )

    found = read_or(state, None)
    if found is None or found.image is None:
        return found
    from . import memory_usage as backed_memory_usage  # the footprint on macOS

    memory = backed_memory_usage(pid)
    rss = read_or(lambda: psutil.Process(pid).memory_info().rss, None)
    return dataclasses.replace(found, memory=memory, rss=rss)


def effective_uid(pid: int) -> int | None:
    return read_or(lambda: psutil.Process(pid).uids().effective, None)


def owner_and_argv(pid: int) -> tuple[int, tuple[str, ...]] | None:
    """Its effective uid and command line, read together."""

    def both() -> tuple[int, tuple[str, ...]]:
        process = psutil.Process(pid)
        with process.oneshot():
            return process.uids().effective, tuple(process.cmdline())

    return read_or(both, None)


def exe_and_argv(pid: int) -> tuple[str | None, tuple[str, ...]] | None:
    """Its executable (None if that alone cannot be read) and command line."""
    process = read_or(lambda: psutil.Process(pid), None)
    if process is None:
        return None
    argv = read_or(process.cmdline, None)
    if argv is None:
        return None
    return read_or(process.exe, None), tuple(argv)


def thread_count(pid: int) -> int | None:
    return read_or(lambda: psutil.Process(pid).num_threads(), None)
