"""XNU's structs as ctypes lays them out on LP64, for `_darwin`'s libproc and sysctl
calls: each field named as in the header it comes from, so that a test can hold its
offsets against the header's (tests/test_darwin.py)."""

from __future__ import annotations

import ctypes
import struct
from typing import Final

_MAXPATHLEN: Final = 1024


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
