"""macOS-only logic, fed by hand: this project's CI has no Mac."""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any, final

import pytest

from exo_orphan_guard.system import _darwin, _posix
from exo_orphan_guard.system.process_facts import MemoryUsage, Pid


@pytest.mark.parametrize(
    ("column", "state"),
    [("Us+\n", "U"), ("U", "U"), ("D+", "D"), ("Ss", None), ("R+", None), ("", None), ("Z", None)],
)
def test_ps_stat_column(column: str, state: str | None) -> None:
    assert _darwin.stuck_state_from_ps(column) == state


@pytest.mark.parametrize(
    ("column", "exiting"),
    [("RE\n", True), ("SE", True), ("UE", False), ("?E", False), ("Ss", False), ("", None)],
)
def test_ps_stat_column_says_whether_it_is_exiting(column: str, exiting: bool | None) -> None:
    """`E`: trying to exit; with `U` (or `?`) it is stuck there, as ranks in the RDMA
    driver are: that is no exit to wait for."""
    assert _darwin.exiting_from_ps(column) is exiting
    assert _darwin.is_exiting(7, run_ps=lambda _pid: column) is exiting


def test_stuck_state_asks_ps_for_the_pid() -> None:
    asked: list[int] = []

    def fake_ps(pid: int) -> str:
        asked.append(pid)
        return "Us+\n"

    assert _darwin.stuck_state(4242, run_ps=fake_ps) == "U"
    assert asked == [4242]


@final
class FakeLibc:
    """sysctlbyname(3), proc_pid_rusage(2) and gethostuuid(3) as macOS answers them."""

    def __init__(
        self,
        sysctls: dict[bytes, bytes],
        footprints: dict[int, int],
        host_uuid: bytes = b"",
        regions: dict[int, list[tuple[int, int, bytes]]] | None = None,
        stale: bool = False,
        tables: list[bytes] | None = None,
    ) -> None:
        self.sysctls = sysctls
        self.footprints = footprints
        self.host_uuid = host_uuid
        self.regions = regions or {}
        """Per pid, its file-backed regions (address, size, path), in address order."""
        self.stale = stale
        """Answer the first region whatever the address: a map that moved under the walk."""
        self.tables = tables or []
        """What each `sysctl(KERN_PROC_ALL)` answers in turn (the last one after)."""
        self.calls: list[tuple[object, ...]] = []

    def sysctl(
        self,
        name: ctypes.Array[ctypes.c_int],
        name_length: int,
        old: ctypes.Array[ctypes.c_char] | None,
        old_size: object,
        new: None,
        new_size: int,
        /,
    ) -> int:
        self.calls.append(("sysctl", tuple(name[:name_length]), old is None))
        size: Any = old_size
        if not self.tables:
            ctypes.set_errno(errno.ENOENT)
            return -1
        table = self.tables[0] if len(self.tables) == 1 else self.tables.pop(0)
        if old is not None:
            if size.contents.value < len(table):
                ctypes.set_errno(errno.ENOMEM)
                return -1
            ctypes.memmove(old, table, len(table))
        size.contents.value = len(table)
        return 0

    def sysctlbyname(
        self,
        name: bytes,
        old: ctypes.Array[ctypes.c_char] | None,
        old_size: object,
        new: None,
        new_size: int,
        /,
    ) -> int:
        self.calls.append((name, old is None, new, new_size))
        size: Any = old_size
        value = self.sysctls.get(name)
        if value is None:
            return -1
        data = value + b"\0"
        if old is not None:
            if size.contents.value < len(data):
                return -1  # ENOMEM
            ctypes.memmove(old, data, len(data))
        size.contents.value = len(data)
        return 0

    def proc_pid_rusage(self, pid: int, flavor: int, buffer: object, /) -> int:
        self.calls.append((pid, flavor))
        if pid not in self.footprints:
            return -1
        info: Any = buffer
        info.contents.ri_resident_size = 1
        info.contents.ri_phys_footprint = self.footprints[pid]
        return 0

    def proc_pidinfo(self, pid: int, flavor: int, arg: int, buffer: object, size: int, /) -> int:
        """PROC_PIDREGIONPATHINFO2 as XNU answers it (`proc_pidregionpathinfo2`): the
        first file-backed region at or after `arg`, EINVAL past the last; the libc
        wrapper returns 0 with errno set on failure."""
        self.calls.append(("proc_pidinfo", pid, flavor, arg, size))
        if pid not in self.regions:
            ctypes.set_errno(errno.EPERM)  # another user's (CHECK_SAME_USER), or ESRCH
            return 0
        for address, length, path in self.regions[pid]:
            if address + length > arg or self.stale:
                info: Any = buffer
                info.contents.prp_prinfo.pri_address = address
                info.contents.prp_prinfo.pri_size = length
                info.contents.prp_vip.vip_path = path
                return ctypes.sizeof(_darwin.RegionWithPathInfo)
        ctypes.set_errno(errno.EINVAL)
        return 0

    def gethostuuid(self, uuid: object, wait: object, /) -> int:
        timeout: Any = wait
        buffer: Any = uuid
        self.calls.append(("gethostuuid", timeout.contents.tv_sec, timeout.contents.tv_nsec))
        if len(self.host_uuid) != 16:
            return -1
        ctypes.memmove(buffer, self.host_uuid, 16)
        return 0


UUID = b"6F9619FF-8B86-D011-B42D-00C04FC964FF"


def test_boot_session_reads_kern_bootsessionuuid() -> None:
    libc = FakeLibc({b"kern.bootsessionuuid": UUID}, {})
    assert _darwin.boot_session(libc) == UUID.decode()
    # Asked for the size first, then for the value.
    assert [call[:2] for call in libc.calls] == [
        (b"kern.bootsessionuuid", True),
        (b"kern.bootsessionuuid", False),
    ]


def test_boot_session_is_none_when_sysctl_fails() -> None:
    assert _darwin.boot_session(FakeLibc({}, {})) is None
    assert _darwin.sysctl_string("kern.empty", FakeLibc({b"kern.empty": b""}, {})) is None


def test_rusage_layout_puts_the_footprint_where_xnu_does() -> None:
    # struct rusage_info_v0: 16-byte uuid, then uint64 fields; footprint is the 8th.
    assert _darwin.RusageInfoV0.ri_phys_footprint.offset == 16 + 7 * 8
    assert ctypes.sizeof(_darwin.RusageInfoV0) == 16 + 10 * 8


def test_memory_is_the_physical_footprint_on_macos() -> None:
    libc = FakeLibc({}, {4242: 313 * 2**30})
    assert _darwin.memory_usage(4242, libc) == MemoryUsage("footprint", 313 * 2**30)
    assert libc.calls == [(4242, 0)]  # RUSAGE_INFO_V0


def test_memory_falls_back_to_rss_labelled_as_such() -> None:
    me = os.getpid()
    usage = _darwin.memory_usage(me, FakeLibc({}, {}))
    assert usage is not None and usage.kind == "rss" and usage.bytes > 0


def test_ps_question_mark_is_unknown_not_unstuck() -> None:
    assert _darwin.stuck_state_from_ps("?") == "?"


def test_ps_exiting_with_unreadable_task_is_unknown() -> None:
    # `?E`: ps could not read the task (XNU refuses it once exit began), P_WEXIT is set.
    assert _darwin.stuck_state_from_ps("?E\n") == "?"


def test_host_uuid_is_gethostuuid_formatted_as_ioreg_shows_it() -> None:
    raw = bytes.fromhex("6F9619FF8B86D011B42D00C04FC964FF")
    libc = FakeLibc({}, {}, host_uuid=raw)
    assert _darwin.host_uuid(libc) == "6F9619FF-8B86-D011-B42D-00C04FC964FF"
    # A bounded wait: a zero timespec would mean waiting forever.
    assert libc.calls == [("gethostuuid", 5, 0)]


def test_host_uuid_is_none_when_the_call_fails_or_says_nothing() -> None:
    assert _darwin.host_uuid(FakeLibc({}, {})) is None
    assert _darwin.host_uuid(FakeLibc({}, {}, host_uuid=bytes(16))) is None


def test_timespec_layout_is_two_longs() -> None:
    assert ctypes.sizeof(_darwin.Timespec) == 2 * ctypes.sizeof(ctypes.c_long)
    assert _darwin.Timespec.tv_nsec.offset == ctypes.sizeof(ctypes.c_long)


EXO_RS = b"/Applications/EXO.app/Contents/Resources/exo/_internal/exo_rs/exo_rs.abi3.so"


def test_region_layout_is_xnus_proc_regionwithpathinfo() -> None:
    # <sys/proc_info.h>: proc_regioninfo is 4 uint32, a uint64, 14 uint32, then the
    # region's address and size; vnode_info_path is vinfo_stat (136 bytes), vi_type,
    # vi_pad, fsid_t (8 bytes), then MAXPATHLEN (1024) bytes of path.
    assert _darwin.ProcRegionInfo.pri_address.offset == 80
    assert ctypes.sizeof(_darwin.ProcRegionInfo) == 96
    assert ctypes.sizeof(_darwin.VinfoStat) == 136
    assert _darwin.VnodeInfoPath.vip_path.offset == 152
    assert _darwin.RegionWithPathInfo.prp_vip.offset == 96
    assert ctypes.sizeof(_darwin.RegionWithPathInfo) == 96 + 152 + 1024


def test_mapped_files_walk_every_file_backed_region_once() -> None:
    exe = b"/Applications/EXO.app/Contents/Resources/exo/exo"
    regions = [(0x1000, 0x4000, exe), (0x9000, 0x1000, EXO_RS), (0xA000, 0x2000, EXO_RS)]
    libc = FakeLibc({}, {}, regions={4242: regions})
    assert _darwin.mapped_files(4242, libc) == {exe.decode(), EXO_RS.decode()}
    asked = [call[3] for call in libc.calls]
    assert asked == [0, 0x5000, 0xA000, 0xC000], "each call starts past the region before"
    assert {call[2] for call in libc.calls} == {22}, "PROC_PIDREGIONPATHINFO2"


def test_mapped_files_of_a_process_that_cannot_be_read_are_unknown() -> None:
    assert _darwin.mapped_files(4242, FakeLibc({}, {})) is None


def test_a_region_walk_that_makes_no_progress_stops() -> None:
    stuck = FakeLibc({}, {}, regions={4242: [(0x1000, 0x1000, EXO_RS)]}, stale=True)
    assert _darwin.mapped_files(4242, stuck) == {EXO_RS.decode()}
    assert [call[3] for call in stuck.calls] == [0, 0x2000]


def _table(*processes: tuple[int, float]) -> bytes:
    """A `KERN_PROC_ALL` answer: one kinfo_proc per (pid, start in seconds)."""
    return b"".join(
        _darwin.KINFO_PROC_HEAD.pack(int(start), round(start % 1 * 1_000_000), pid)
        for pid, start in processes
    )


def _my_start() -> float:
    start = _posix.read_start(os.getpid())
    assert start is not None
    return start.started


def test_kinfo_proc_layout_puts_the_pid_where_xnu_does() -> None:
    # struct extern_proc: a 16-byte timeval, two pointers, p_flag, p_stat, then p_pid.
    assert _darwin.ExternProcHead.p_pid.offset == 40
    assert _darwin.KINFO_PROC_HEAD.size == _darwin.KINFO_PROC_SIZE == 648


def test_the_process_table_is_each_pid_with_its_start_in_microseconds() -> None:
    table = _table((0, 1000.0), (1, 1000.25), (4242, 1_790_000_000.5))
    assert _darwin.parse_process_table(table) == {
        0: 1_000_000_000,
        1: 1_000_250_000,
        4242: 1_790_000_000_500_000,
    }
    assert _darwin.parse_process_table(table[:-1]) is None, "not whole records"
    assert _darwin.parse_process_table(b"") is None


def test_the_process_table_is_read_in_one_sysctl_after_its_size() -> None:
    me = os.getpid()
    libc = FakeLibc({}, {}, tables=[_table((1, 5.0), (me, _my_start()))])
    listed = _darwin.list_processes(libc)
    assert set(listed) == {1, me} and listed[Pid(1)] == 5_000_000
    assert [call[:3] for call in libc.calls] == [
        ("sysctl", (1, 14, 0), True),  # CTL_KERN, KERN_PROC, KERN_PROC_ALL: its size
        ("sysctl", (1, 14, 0), False),
    ]


def test_a_table_that_grew_past_the_room_left_is_read_again() -> None:
    me = os.getpid()
    small = _table((me, _my_start()))
    grown = _table(*((pid, 1.0) for pid in range(100, 200)), (me, _my_start()))
    libc = FakeLibc({}, {}, tables=[small, grown, grown, grown])
    assert len(_darwin.list_processes(libc)) == 101
    assert len(libc.calls) == 4


def test_a_table_that_does_not_show_this_process_as_it_is_is_not_trusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kinfo_proc laid out otherwise than this code reads it: psutil's listing, no
    stamps, so that every command line is read."""
    warned: list[str] = []
    monkeypatch.setattr(_darwin, "warn_once", warned.append)
    me = os.getpid()
    for libc in (
        FakeLibc({}, {}, tables=[_table((1, 5.0))]),
        FakeLibc({}, {}, tables=[_table((me, _my_start() + 2))]),
        FakeLibc({}, {}, tables=[_table((me, _my_start()))[:-8]]),
        FakeLibc({}, {}),
    ):
        listed = _darwin.list_processes(libc)
        assert me in listed and set(listed.values()) == {None}
    assert len(warned) == 4 and "cannot be read here" in warned[0]
