"""Linux: read /proc directly and call prctl.

psutil would do all of this too, but slower: the watch and the registry sweep sit on
hot paths, and a full scan touches every process on the machine.
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Final, final

from .process_facts import CreationMark, Pid, ProcessStart, Stamp

_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG: Final = 1
_PR_SET_CHILD_SUBREAPER: Final = 36
_EXITED_STATES: Final = frozenset({"Z", "X", "x"})


def pipes_visible() -> bool:
    """`pipe_inodes` answers for processes of this user."""
    return True


@final
@dataclass(frozen=True, slots=True)
class StatFields:
    state: str
    ppid: int
    pgrp: int
    start_ticks: int


def read_stat(pid: int) -> StatFields | None:
    """None once the process is gone; PermissionError if it exists but cannot be read.

    Only ENOENT and ESRCH mean gone: EMFILE, EACCES and the like say nothing about the
    process, and a sweep that took them for "gone" would judge on a guess.
    """
    try:
        data = _read_small(f"/proc/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as error:
        raise _unreadable(pid, error) from error
    if not data:
        return None  # the process was reaped between open and read
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return StatFields(
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        start_ticks=int(fields[19]),
    )


def read_start(pid: int) -> ProcessStart | None:
    stat = read_stat(pid)
    if stat is None:
        return None
    return ProcessStart(stat.start_ticks / _CLOCK_TICKS, stat.state in _EXITED_STATES)


def parent_pid(pid: int) -> int | None:
    """None once gone; PermissionError if unreadable."""
    stat = read_stat(pid)
    return None if stat is None else stat.ppid


def forked_by_main_thread(parent: int, child: int) -> bool | None:
    """Whether `child` hangs off `parent`'s main thread (None: the kernel won't say).

    PR_SET_PDEATHSIG fires when the parent *thread* exits, so it is only safe for a
    child of the main thread, which lives as long as the process.
    """
    try:
        children = _read_small(f"/proc/{parent}/task/{parent}/children")
    except FileNotFoundError:
        # No such file with the process still there: CONFIG_PROC_CHILDREN is off.
        return None if os.path.isdir(f"/proc/{parent}/task/{parent}") else False
    except OSError:
        return None
    return str(child).encode() in children.split()


def set_parent_death_signal(signal_number: int) -> bool:
    return _prctl(_PR_SET_PDEATHSIG, signal_number)


def become_child_subreaper() -> bool:
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def descendants(pid: int) -> list[Pid]:
    """Children, grandchildren, ...: each pid once, parents before their children."""
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
    """One close_range(2) call on Linux >= 5.9 (CPython's `closerange`)."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    upper = soft_limit if soft_limit != resource.RLIM_INFINITY else 1 << 20
    os.closerange(lowest, min(upper, 1 << 20))


def child_pids(pid: int) -> list[Pid]:
    found: list[Pid] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            data = _read_small(f"/proc/{pid}/task/{task}/children")
        except OSError:
            continue
        found.extend(Pid(int(word)) for word in data.split())
    return found


def stuck_state(pid: int) -> str | None:
    """'D' for uninterruptible sleep, the state in which even SIGKILL waits."""
    try:
        stat = read_stat(pid)
    except PermissionError:
        return None
    return "D" if stat is not None and stat.state == "D" else None


def is_stopped(pid: int) -> bool | None:
    try:
        stat = read_stat(pid)
    except PermissionError:
        return None
    return None if stat is None else stat.state in ("T", "t")


def pipe_inodes(pid: int) -> frozenset[int] | None:
    """The pipes `pid` holds open (by inode); None if its descriptors cannot be read.

    A multiprocessing spawn child holds the write end of a pipe whose read end its
    spawner keeps as the child's sentinel, for as long as the child lives. A process
    that merely adopted the child (a subreaper) holds no such pipe.
    """
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    inodes: set[int] = set()
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            continue  # closed meanwhile
        except OSError:
            return None
        if target.startswith("pipe:["):
            inodes.add(int(target[6:-1]))
    return frozenset(inodes)


def mapped_files(pid: int) -> frozenset[str] | None:
    """The files named in /proc/<pid>/maps (reading it needs the access ptrace would:
    another user's process answers None)."""
    try:
        data = _read_all(f"/proc/{pid}/maps")
    except OSError:
        return None
    return frozenset(_mapped_paths(data))


def _mapped_paths(maps: bytes) -> Iterator[str]:
    """Each line: address, perms, offset, device, inode, then the path, which may hold
    spaces (so the split stops there) and ends in " (deleted)" once unlinked."""
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith(b"/"):
            yield fields[5].decode(errors="replace").removesuffix(" (deleted)")


def environment_value(pid: int, name: str) -> str | None:
    """`name` in the environment `pid` started with; None if unset. PermissionError if
    the environment cannot be read (it may be set: callers must not assume it is not)."""
    try:
        data = _read_all(f"/proc/{pid}/environ")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as error:
        raise _unreadable(pid, error) from error
    prefix = name.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def iter_command_lines() -> Iterator[tuple[Pid, bytes]]:
    """Every process's raw NUL-separated argv; kernel threads (empty argv) skipped."""
    for name in _proc_entries():
        if name.isdigit():
            data = command_line(int(name))
            if data is not None:
                yield Pid(int(name)), data


def command_line(pid: int) -> bytes | None:
    """Its raw argv; None if empty (a kernel thread, a zombie) or unreadable."""
    try:
        data = _read_all(f"/proc/{pid}/cmdline", short_read_ends=True)
    except OSError:
        return None
    return data or None


def list_processes() -> dict[Pid, Stamp | None]:
    """Each process with the inode of its /proc entry, which readdir reports at no
    cost: the kernel makes a new one for each process that holds the pid (the old
    process's entry is dropped when it is reaped, before the pid is free again)."""
    found: dict[Pid, Stamp | None] = {}
    try:
        with os.scandir("/proc") as entries:
            for entry in entries:
                if entry.name.isdigit():
                    found[Pid(int(entry.name))] = _stamp(entry.inode())
    except OSError:
        pass
    return found


def processes_among(pids: Collection[int]) -> dict[Pid, Stamp | None]:
    """/proc/<id> opens for a thread's id too, which readdir never lists: only a thread
    group's leader (its `Tgid` is its own id) is a process."""
    found: dict[Pid, Stamp | None] = {}
    for pid in pids:
        try:
            directory = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            inode = os.fstat(directory).st_ino
            status = _read_small("status", directory)
        except OSError:
            continue
        finally:
            os.close(directory)
        if _field(status, b"Tgid:") == str(pid).encode():
            found[Pid(pid)] = _stamp(inode)
    return found


def stamp_of(pid: int) -> Stamp | None:
    """One stat, where `processes_among` also reads the status file to tell a thread."""
    try:
        return _stamp(os.stat(f"/proc/{pid}").st_ino)
    except OSError:
        return None


def _stamp(inode: int) -> Stamp | None:
    """readdir reports inode 1 for an entry it could not set up (its process exiting)."""
    return inode if inode > 1 else None


def creation_mark() -> CreationMark | None:
    try:
        load = _read_small("/proc/loadavg").split()
        forks = _field(_read_all("/proc/stat"), b"processes")
        pid_max = _read_small("/proc/sys/kernel/pid_max")
        return CreationMark(
            last_pid=int(load[4]),
            forks=int(forks or b""),
            tasks=int(load[3].split(b"/")[1]),
            pid_max=int(pid_max),
        )
    except (OSError, IndexError, ValueError):
        return None


def _field(text: bytes, name: bytes) -> bytes | None:
    """The value after `name` on the line that starts with it."""
    for line in text.splitlines():
        if line.startswith(name):
            return line[len(name) :].strip()
    return None


def process_group(pid: int) -> int | None:
    try:
        stat = read_stat(pid)
    except PermissionError:
        return None
    return None if stat is None else stat.pgrp


def group_members(groups: Collection[int]) -> list[Pid]:
    """Processes whose process group is one of `groups`."""
    found: list[Pid] = []
    for name in _proc_entries():
        if name.isdigit():
            try:
                stat = read_stat(int(name))
            except PermissionError:
                continue  # unread, so never claimed as a member
            if stat is not None and stat.pgrp in groups:
                found.append(Pid(int(name)))
    return found


def _proc_entries() -> list[str]:
    try:
        return os.listdir("/proc")
    except OSError:
        return []


def _read_small(path: str, directory: int | None = None) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


_CHUNK: Final = 65536


def _read_all(path: str, *, short_read_ends: bool = False) -> bytes:
    """`short_read_ends`: a read short of the buffer is the last (/proc/<pid>/cmdline:
    copied until the buffer or the arguments end), saving the read of nothing."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
            if short_read_ends and len(chunk) < _CHUNK:
                break
        return b"".join(chunks)
    finally:
        os.close(fd)


def _unreadable(pid: int, error: OSError) -> PermissionError:
    return PermissionError(error.errno, f"cannot read process {pid}: {error.strerror}")


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> bool:
    return bool(_libc().prctl(option, value, 0, 0, 0) == 0)
