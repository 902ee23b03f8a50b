"""doctor's wired-memory line: the decision on made-up figures, the Mac's measurement
by injection (psutil's `virtual_memory` and libproc faked), and this machine's line."""

from __future__ import annotations

import json
import sys
from typing import NamedTuple

import pytest

from exo_orphan_guard.system import _darwin
from exo_orphan_guard.system.process_facts import WiredMemory
from exo_orphan_guard.tools import cli, stranded_memory
from tests.test_darwin import FakeLibc

GIB = 2**30


class Svmem(NamedTuple):
    """psutil.virtual_memory() on macOS (`_psosx.virtual_memory`)."""

    total: int
    available: int
    percent: float
    used: int
    free: int
    active: int
    inactive: int
    wired: int


class LinuxSvmem(NamedTuple):
    total: int
    available: int


def figures(ram: int, wired: int, footprints: int, unreadable: int = 0) -> WiredMemory:
    return WiredMemory(ram * GIB, wired * GIB, footprints * GIB, 1200, unreadable)


def test_the_omlx_report_warns_with_the_reboot_advice_and_the_source() -> None:
    # "496 GB of 512 GB wired with far less accounted for by live processes".
    check = stranded_memory.check(figures(512, 496, 12))
    assert check.status == "WARN" and "484.0 GiB unaccounted" in check.detail
    assert "host_statistics64" in check.detail and "proc_pid_rusage" in check.detail
    assert "reboot this Mac" in str(check.next_step) and "jundot/omlx" in str(check.next_step)
    assert check.figures["unaccounted_bytes"] == 484 * GIB and check.figures["stranded"] is True


@pytest.mark.parametrize(
    ("ram", "wired", "footprints"),
    [
        (512, 60, 20),  # 40 GiB: past 8 GiB, not past 10% of RAM
        (32, 9, 3),  # 6 GiB: past 10% of RAM, not past 8 GiB
        (64, 4, 40),  # a healthy Mac: footprints exceed wired
    ],
)
def test_below_either_floor_is_ok(ram: int, wired: int, footprints: int) -> None:
    check = stranded_memory.check(figures(ram, wired, footprints))
    assert check.status == "OK" and check.figures["stranded"] is False


def test_past_both_floors_is_a_warning() -> None:
    assert stranded_memory.check(figures(64, 30, 10)).status == "WARN"


def test_unreadable_footprints_are_named() -> None:
    check = stranded_memory.check(figures(512, 496, 12, unreadable=40))
    assert "40 process(es) could not be read" in check.detail and "root" in check.detail


def test_other_systems_say_it_does_not_apply() -> None:
    check = stranded_memory.check(None)
    assert check.status == "SKIP" and "does not apply" in check.detail
    unreadable = stranded_memory.check("psutil reports no wired memory here")
    assert unreadable.status == "SKIP" and unreadable.figures == {"error": unreadable.detail}


def test_the_mac_sums_every_readable_footprint() -> None:
    libc = FakeLibc({}, {1: 2 * GIB, 300: 10 * GIB})  # pid 0 (kernel_task) unreadable
    measured = _darwin.wired_memory(
        libc,
        virtual_memory=lambda: Svmem(512 * GIB, 0, 0.0, 0, 0, 0, 0, 496 * GIB),
        pids=lambda: [0, 1, 300],
    )
    assert measured == WiredMemory(512 * GIB, 496 * GIB, 12 * GIB, processes=2, unreadable=1)
    assert [call[0] for call in libc.calls] == [0, 1, 300]


def test_the_mac_says_so_when_psutil_cannot_read_the_machine() -> None:
    def failing() -> object:
        raise RuntimeError("host_statistics(HOST_VM_INFO) syscall failed")

    failed = _darwin.wired_memory(FakeLibc({}, {}), virtual_memory=failing, pids=list)
    assert isinstance(failed, str) and "host_statistics" in failed
    linux = _darwin.wired_memory(
        FakeLibc({}, {}), virtual_memory=lambda: LinuxSvmem(1, 1), pids=list
    )
    assert isinstance(linux, str) and "no wired memory" in linux


@pytest.mark.skipif(sys.platform == "darwin", reason="the line applies on macOS")
def test_doctor_here_says_it_does_not_apply(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["doctor", "--json"])
    checks = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["wired memory"]["status"] == "SKIP"
    assert "does not apply" in checks["wired memory"]["detail"]
