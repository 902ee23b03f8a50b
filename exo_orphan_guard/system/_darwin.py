"""macOS: psutil for everything (`_posix`), plus `ps`, sysctl and libproc for what
psutil lacks: the names defined here replace `_posix`'s (`backend`).

Run on macOS by operators (`exo-orphan-guard selftest`), not by this project's CI,
which runs the rest of the portable backend on Linux: keep it this small, and keep
each OS call in a few lines whose library tests inject.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import subprocess
import uuid
from collections.abc import Callable
from functools import cache
from typing import Final, Protocol, cast

import psutil

from ._posix import boot_id as posix_boot_id
from ._posix import list_processes as posix_list_processes
from ._posix import memory_usage as posix_memory_usage
from ._posix import read_start as posix_read_start
from .once import warn_once
from .process_facts import MemoryUsage, Pid, Stamp, WiredMemory

_RUSAGE_INFO_V0: Final = 0
_PROC_PIDREGIONPATHINFO2: Final = 22
"""`proc_info_private.h`: the first region at or after the address that maps a file
(anonymous memory skipped), with its path; what libproc's own `proc_regionfilename`
asks for. EINVAL once no such region is left."""
_MAXPATHLEN: Final = 1024
_MAX_REGIONS: Final = 1 << 17
"""A bound on the walk, far above the few thousand file-backed regions of a Python
process with MLX loaded: a map that kept changing under the walk cannot loop it."""
_HOST_UUID_WAIT_SECONDS: Final = 5
"""gethostuuid(3) waits for IOKit to publish IOPlatformUUID (long done after boot); a
zero timeout would mean waiting forever."""


class DarwinLibc(Protocol):
    """The libSystem calls used here (tests pass a fake)."""

    def sysctl(
        self,
        name: ctypes.Array[ctypes.c_int],
        name_length: int,
        old: ctypes.Array[ctypes.c_char] | None,
        old_size: object,
        new: None,
        new_size: int,
        /,
    ) -> int: ...

    def sysctlbyname(
        self,
        name: bytes,
        old: ctypes.Array[ctypes.c_char] | None,
        old_size: object,
        new: None,
        new_size: int,
        /,
    ) -> int: ...

    def proc_pid_rusage(self, pid: int, flavor: int, buffer: object, /) -> int: ...

    def gethostuuid(self, uuid: object, wait: object, /) -> int: ...

    def proc_pidinfo(
        self, pid: int, flavor: int, arg: int, buffer: object, size: int, /
    ) -> int: ...


class Timespec(ctypes.Structure):
    """`struct timespec` from <sys/_types/_timespec.h>: two longs on LP64."""

    _fields_ = (  # pyright: ignore[reportUnannotatedClassAttribute]
        ("tv_sec", ctypes.c_long),
        ("tv_nsec", ctypes.c_long),
    )


class RusageInfoV0(ctypes.Structure):
    """`struct rusage_info_v0` from <sys/resource.h>: the fields up to the footprint."""

    _fields_ = (  # pyright: ignore[reportUnannotatedClassAttribute]
        ("ri_uuid", ctypes.c_uint8 * 16),
        ("ri_user_time", ctypes.c_uint64),
        ("ri_system_time", ctypes.c_uint64),
        ("ri_pkg_idle_wkups", ctypes.c_uint64),
        ("ri_interrupt_wkups", ctypes.c_uint64),
        ("ri_pageins", ctypes.c_uint64),
        ("ri_wired_size", ctypes.c_uint64),
        ("ri_resident_size", ctypes.c_uint64),
        ("ri_phys_footprint", ctypes.c_uint64),
        ("ri_proc_start_abstime", ctypes.c_uint64),
        ("ri_proc_exit_abstime", ctypes.c_uint64),
    )


_REGION_COUNTERS: Final = (
    "pri_behavior",
    "pri_user_wired_count",
    "pri_user_tag",
    "pri_pages_resident",
    "pri_pages_shared_now_private",
    "pri_pages_swapped_out",
    "pri_pages_dirtied",
    "pri_ref_count",
    "pri_shadow_depth",
    "pri_share_mode",
    "pri_private_pages_resident",
    "pri_shared_pages_resident",
    "pri_obj_id",
    "pri_depth",
)


class ProcRegionInfo(ctypes.Structure):
    """`struct proc_regioninfo` from <sys/proc_info.h>."""

    _fields_ = (  # pyright: ignore[reportUnannotatedClassAttribute]
        ("pri_protection", ctypes.c_uint32),
        ("pri_max_protection", ctypes.c_uint32),
        ("pri_inheritance", ctypes.c_uint32),
        ("pri_flags", ctypes.c_uint32),
        ("pri_offset", ctypes.c_uint64),
        *((name, ctypes.c_uint32) for name in _REGION_COUNTERS),
        ("pri_address", ctypes.c_uint64),
        ("pri_size", ctypes.c_uint64),
    )


class VinfoStat(ctypes.Structure):
    """`struct vinfo_stat`: stat64 with fixed-size fields."""

    _fields_ = (  # pyright: ignore[reportUnannotatedClassAttribute]
        ("vst_dev", ctypes.c_uint32),
        ("vst_mode", ctypes.c_uint16),
        ("vst_nlink", ctypes.c_uint16),
        ("vst_ino", ctypes.c_uint64),
        ("vst_uid", ctypes.c_uint32),
        ("vst_gid", ctypes.c_uint32),
        ("vst_times", ctypes.c_int64 * 8),
        ("vst_size", ctypes.c_int64),
        ("vst_blocks", ctypes.c_int64),
        ("vst_blksize", ctypes.c_int32),
        ("vst_flags", ctypes.c_uint32),
        ("vst_gen", ctypes.c_uint32),
        ("vst_rdev", ctypes.c_uint32),
        ("vst_qspare", ctypes.c_int64 * 2),
    )


class VnodeInfoPath(ctypes.Structure):
    """`struct vnode_info_path`: `struct vnode_info` (the stat, the vnode type, a pad,
    the fsid), then the path."""

    _fields_ = (  # pyright: ignore[reportUnannotatedClassAttribute]
        ("vi_stat", VinfoStat),
        ("vi_type", ctypes.c_int),
        ("vi_pad", ctypes.c_int),
        ("vi_fsid", ctypes.c_int32 * 2),
        ("vip_path", ctypes.c_char * _MAXPATHLEN),
    )


class RegionWithPathInfo(ctypes.Structure):
    """`struct proc_regionwithpathinfo`: what PROC_PIDREGIONPATHINFO2 fills."""

    _fields_ = (  # pyright: ignore[reportUnannotatedClassAttribute]
        ("prp_prinfo", ProcRegionInfo),
        ("prp_vip", VnodeInfoPath),
    )


def region_paths(pid: int, libc: DarwinLibc) -> frozenset[str] | None:
    """The files `pid` maps, walked region by region as `lsof` and `vmmap` do (psutil
    has no memory maps on macOS). Same-user processes only (`proc_pidinfo`'s
    CHECK_SAME_USER): None for another user's, or a gone one."""
    info = RegionWithPathInfo()
    size = ctypes.sizeof(info)
    paths: set[str] = set()
    address = 0
    for _ in range(_MAX_REGIONS):
        written = libc.proc_pidinfo(
            pid, _PROC_PIDREGIONPATHINFO2, address, ctypes.pointer(info), size
        )
        if written < size:
            # EINVAL: no file-backed region at or after `address`, the walk's end.
            return frozenset(paths) if ctypes.get_errno() == errno.EINVAL else None
        region = info.prp_prinfo
        if path := bytes(info.prp_vip.vip_path).split(b"\0", 1)[0]:
            paths.add(path.decode(errors="replace"))
        following = int(region.pri_address) + int(region.pri_size)
        if following <= address:
            break
        address = following
    return frozenset(paths)


class ExternProcHead(ctypes.Structure):
    """The first fields of `struct extern_proc` (<sys/proc.h>), which opens each
    `struct kinfo_proc` of `sysctl(KERN_PROC_ALL)`: the start, then, past a few
    others, the pid (offset 40 on LP64, as Go's x/sys/unix lays it out)."""

    _fields_ = (  # pyright: ignore[reportUnannotatedClassAttribute]
        ("p_starttime_sec", ctypes.c_int64),
        ("p_starttime_usec", ctypes.c_int32),
        ("p_vmspace", ctypes.c_void_p),
        ("p_sigacts", ctypes.c_void_p),
        ("p_flag", ctypes.c_int32),
        ("p_stat", ctypes.c_char),
        ("p_pid", ctypes.c_int32),
    )


KINFO_PROC_SIZE: Final = 648
"""sizeof(struct kinfo_proc) on LP64 macOS (x/sys/unix's SizeofKinfoProc)."""
_PID_OFFSET: Final[int] = ExternProcHead.p_pid.offset  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
KINFO_PROC_HEAD: Final = struct.Struct(
    f"=qi{_PID_OFFSET - 12}xi{KINFO_PROC_SIZE - _PID_OFFSET - 4}x"
)
"""One kinfo_proc: start seconds, start microseconds, pid."""
_KERN_PROC_ALL: Final = (1, 14, 0)
"""CTL_KERN, KERN_PROC, KERN_PROC_ALL."""
_TABLE_TRIES: Final = 4


def parse_process_table(data: bytes) -> dict[Pid, Stamp] | None:
    """Each pid of a `KERN_PROC_ALL` answer with its start in microseconds; None if
    the answer is not whole kinfo_proc records."""
    if not data or len(data) % KINFO_PROC_SIZE:
        return None
    return {
        Pid(pid): seconds * 1_000_000 + microseconds
        for seconds, microseconds, pid in KINFO_PROC_HEAD.iter_unpack(data)
    }


def process_table(libc: DarwinLibc) -> dict[Pid, Stamp] | None:
    """One `sysctl(KERN_PROC_ALL)`, as `ps` reads the process table: its size first,
    then the table, with room for processes started in between (ENOMEM: more than
    that, so again)."""
    name = (ctypes.c_int * 3)(*_KERN_PROC_ALL)
    for _ in range(_TABLE_TRIES):
        size = ctypes.c_size_t(0)
        if libc.sysctl(name, 3, None, ctypes.pointer(size), None, 0) != 0:
            return None
        size.value += size.value // 8 + 16 * KINFO_PROC_SIZE
        buffer = ctypes.create_string_buffer(size.value)
        if libc.sysctl(name, 3, buffer, ctypes.pointer(size), None, 0) == 0:
            return parse_process_table(buffer.raw[: size.value])
        if ctypes.get_errno() != errno.ENOMEM:
            return None
    return None


def list_processes(libc: DarwinLibc | None = None) -> dict[Pid, Stamp | None]:
    """Stamped by start, read for every process in one call; psutil's listing (no
    stamps) if the answer does not show this process with its own start, which a
    layout other than the one above would not."""
    found = process_table(libc or _libc())
    me = os.getpid()
    start = posix_read_start(me)
    if (
        found is None
        or start is None
        or abs(found.get(Pid(me), -1) / 1_000_000 - start.started) > 0.001
    ):
        warn_once("orphan guard: the process table (sysctl KERN_PROC_ALL) cannot be read here")
        return posix_list_processes()
    return dict(found)


def sysctl_string(name: str, libc: DarwinLibc) -> str | None:
    """A string sysctl by name (`sysctlbyname(3)`): size first, then the value."""
    size = ctypes.c_size_t(0)
    if libc.sysctlbyname(name.encode(), None, ctypes.pointer(size), None, 0) != 0:
        return None
    buffer = ctypes.create_string_buffer(size.value + 1)
    size.value = len(buffer)
    if libc.sysctlbyname(name.encode(), buffer, ctypes.pointer(size), None, 0) != 0:
        return None
    return buffer.value.decode(errors="replace") or None


def boot_session(libc: DarwinLibc) -> str | None:
    """`kern.bootsessionuuid`: set once per boot, never derived from a clock."""
    return sysctl_string("kern.bootsessionuuid", libc)


def host_uuid(libc: DarwinLibc) -> str | None:
    """The Mac's hardware UUID (IOPlatformUUID) from `gethostuuid(3)`: unlike the
    hostname, which macOS changes at run time (DHCP, Bonjour's "-2" renames), no
    rename or network moves it."""
    buffer = (ctypes.c_uint8 * 16)()
    wait = Timespec(_HOST_UUID_WAIT_SECONDS, 0)
    if libc.gethostuuid(buffer, ctypes.pointer(wait)) != 0 or not any(buffer):
        return None
    return str(uuid.UUID(bytes=bytes(buffer))).upper()


def physical_footprint(pid: int, libc: DarwinLibc) -> int | None:
    """`ri_phys_footprint` from `proc_pid_rusage`: Metal buffers included, unlike RSS."""
    info = RusageInfoV0()
    if libc.proc_pid_rusage(pid, _RUSAGE_INFO_V0, ctypes.pointer(info)) != 0:
        return None
    return int(info.ri_phys_footprint)


@cache
def _libc() -> DarwinLibc:
    libc = ctypes.CDLL(None, use_errno=True)
    size_pointer = ctypes.POINTER(ctypes.c_size_t)
    libc.sysctlbyname.argtypes = (
        ctypes.c_char_p,
        ctypes.c_void_p,
        size_pointer,
        ctypes.c_void_p,
        ctypes.c_size_t,
    )
    libc.sysctlbyname.restype = ctypes.c_int
    libc.sysctl.argtypes = (
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_uint,
        ctypes.c_void_p,
        size_pointer,
        ctypes.c_void_p,
        ctypes.c_size_t,
    )
    libc.sysctl.restype = ctypes.c_int
    libc.proc_pid_rusage.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
    libc.proc_pid_rusage.restype = ctypes.c_int
    libc.gethostuuid.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    libc.gethostuuid.restype = ctypes.c_int
    libc.proc_pidinfo.argtypes = (
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.c_void_p,
        ctypes.c_int,
    )
    libc.proc_pidinfo.restype = ctypes.c_int
    return cast(DarwinLibc, libc)


@cache
def boot_id() -> str:
    return boot_session(_libc()) or posix_boot_id()


@cache
def hardware_uuid() -> str | None:
    return host_uuid(_libc())


def mapped_files(pid: int, libc: DarwinLibc | None = None) -> frozenset[str] | None:
    return region_paths(pid, libc or _libc())


def memory_usage(pid: int, libc: DarwinLibc | None = None) -> MemoryUsage | None:
    footprint = physical_footprint(pid, libc or _libc())
    if footprint is None:
        return posix_memory_usage(pid)
    return MemoryUsage("footprint", footprint)


def stuck_state_from_ps(stat_column: str) -> str | None:
    """`U` (uninterruptible wait) or `D` from `ps -o stat=` output, `?` where ps could
    not inspect the process (hardened-runtime apps): unknown, not "not stuck". Else None.

    psutil maps macOS states from `kinfo_proc.p_stat`, which has no such state; the
    flag only shows in ps's STAT column (e.g. `Us+`), where ranks stuck in the RDMA
    driver sit and ignore SIGKILL.
    """
    flags = stat_column.strip()
    if not flags:
        return None
    return flags[0] if flags[0] in ("U", "D", "?") else None


def stuck_state(pid: int, run_ps: Callable[[int], str] | None = None) -> str | None:
    return stuck_state_from_ps((run_ps or _ps_stat)(pid))


def exiting_from_ps(stat_column: str) -> bool | None:
    """Whether ps's STAT flags say the process is on its way out (`E`), and not stuck
    there (`U`, or `?`: ps could not inspect it, as a rank stuck in a driver on its
    way out shows); None when ps said nothing."""
    flags = stat_column.strip()
    if not flags:
        return None
    return "E" in flags and stuck_state_from_ps(flags) is None


def is_exiting(pid: int, run_ps: Callable[[int], str] | None = None) -> bool | None:
    return exiting_from_ps((run_ps or _ps_stat)(pid))


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


def wired_memory(
    libc: DarwinLibc | None = None,
    virtual_memory: Callable[[], object] = psutil.virtual_memory,
    pids: Callable[[], list[int]] = psutil.pids,
) -> WiredMemory | str:
    """Wired memory (psutil's `wired`: host_statistics64's wire_count times the page
    size, what `vm_stat` prints as "Pages wired down") beside the physical footprints
    of every live process that can be read; a string: why the machine's figures
    cannot be read."""
    try:
        memory = virtual_memory()
        listed = pids()
    except (RuntimeError, OSError) as error:
        return f"psutil could not read the machine's memory: {error}"
    ram, wired = getattr(memory, "total", None), getattr(memory, "wired", None)
    if not isinstance(ram, int) or not isinstance(wired, int):
        return "psutil reports no wired memory here"
    handle = libc or _libc()
    footprints = [physical_footprint(pid, handle) for pid in listed]
    read = [footprint for footprint in footprints if footprint is not None]
    return WiredMemory(
        ram=ram,
        wired=wired,
        footprints=sum(read),
        processes=len(read),
        unreadable=len(footprints) - len(read),
    )
