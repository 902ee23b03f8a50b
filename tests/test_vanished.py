"""A rank stuck in the kernel on its way out: listed, but its details refused.

Shaped on XNU (xnu-11417): once `proc_prepareexit` sets P_REF_DEAD, `proc_find` fails
for the process, so psutil's `memory_info()`, `cmdline()` and `exe()` raise
NoSuchProcess and `getpgid` gives ESRCH, while the `kinfo_proc` sysctl (psutil's
`ppid`, `uids`, `status`, `create_time`, and `read_start`) still lists it; `ps -o stat=`
shows `?E`. Injected on a real orphan of the test's own, which the sweep could
otherwise judge: it must stay in the snapshot, be shown, and never be taken for gone.
"""

from __future__ import annotations

import errno
import functools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import final

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records.registry import Registry, RunnerRecord
from exo_orphan_guard.sweeper import process_table, report_format
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system._posix import iter_command_lines
from exo_orphan_guard.system.identity import ProcessIdentity, liveness
from exo_orphan_guard.system.process_facts import Pid
from exo_orphan_guard.tools import doctor
from tests.helpers.processes import kill_all, sleeper, start_orphan

TOKEN = "eog-vanished-token"
DEAD_WORKER = ProcessIdentity(Pid(4_194_305), 1.0)
"""Above Linux's largest pid_max: a worker that cannot exist."""


@final
@dataclass(frozen=True, slots=True)
class Stuck:
    identity: ProcessIdentity
    argv: tuple[str, ...]
    """Its command line, read before the kernel refused it (what its record holds)."""

    @property
    def pid(self) -> Pid:
        return self.identity.pid


@pytest.fixture
def stuck_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stuck]:
    """A live orphan of the test's, whose details XNU would refuse."""
    rank = start_orphan(sleeper(TOKEN))
    settle(rank.pid)
    stuck = Stuck(rank, tuple(psutil.Process(rank.pid).cmdline()))
    for method in ("memory_info", "cmdline", "exe"):
        refuse(monkeypatch, method, rank.pid)
    real_getpgid = os.getpgid

    def getpgid(pid: int) -> int:
        if pid == rank.pid:
            raise ProcessLookupError(errno.ESRCH, "No such process")
        return real_getpgid(pid)

    monkeypatch.setattr(os, "getpgid", getpgid)
    try:
        yield stuck
    finally:
        monkeypatch.undo()
        kill_all([rank])


def settle(pid: int) -> None:
    """Wait until the rank sleeps: a loaded machine shows it in D while it pages in."""
    process = psutil.Process(pid)
    deadline = time.monotonic() + 30.0
    while process.status() != psutil.STATUS_SLEEPING:
        assert time.monotonic() < deadline, f"{pid} never settled: {process.status()}"
        time.sleep(0.01)


def refuse(monkeypatch: pytest.MonkeyPatch, method: str, victim: int) -> None:
    real = getattr(psutil.Process, method)

    @functools.wraps(real)  # keeps psutil's oneshot() cache hooks
    def replacement(self: psutil.Process, *args: object, **kwargs: object) -> object:
        if self.pid == victim:
            raise psutil.NoSuchProcess(victim)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(psutil.Process, method, replacement)


def record_of(rank: Stuck, registry: Path) -> Path:
    opened, problem = Registry.open(registry, create=True)
    assert opened is not None, problem
    return opened.write(
        RunnerRecord(
            pid=rank.pid,
            started=rank.identity.started,
            boot_id=system.boot_id(),
            uid=os.geteuid(),
            worker=DEAD_WORKER,
            exe=None,
            argv=rank.argv,
            pgid=None,
            recorded_at=0.0,
        )
    )


def test_it_stays_in_the_snapshot_with_state_known_memory_and_group_unknown(
    stuck_rank: Stuck,
) -> None:
    table = process_table.gather([stuck_rank.pid], fingerprint=False, match=None)
    info = table.processes[stuck_rank.pid]
    assert info.vanished and info.status == "exiting" and not info.exited
    assert info.started == stuck_rank.identity.started and info.uid == os.geteuid()
    assert (info.memory, info.rss, info.pgid) == (None, None, None)
    assert liveness(stuck_rank.identity) == "alive"  # what the kill escalation waits on


def test_the_portable_command_line_scan_keeps_what_it_cannot_name(stuck_rank: Stuck) -> None:
    found = dict(iter_command_lines())
    assert found[stuck_rank.pid] == b""


@pytest.mark.skipif(
    system.BACKEND == "linux", reason="the Linux backend reads /proc/PID/cmdline, which answers"
)
def test_a_fingerprint_snapshot_keeps_it(stuck_rank: Stuck) -> None:
    table = process_table.gather([], fingerprint=True, match=None)
    assert table.processes[stuck_rank.pid].vanished


def test_scan_shows_it_with_the_reboot_advice_and_keeps_its_record(
    stuck_rank: Stuck, isolated_environment: Path
) -> None:
    path = record_of(stuck_rank, isolated_environment)
    report = sweep(dry_run=True, fingerprint=False)
    (verdict,) = [v for v in report.verdicts if v.pid == stuck_rank.pid]
    assert verdict.action == "spare" and "reboot" in verdict.reason
    table = report_format.to_table(report)
    assert f"EXITING {stuck_rank.pid} " in table and "only a reboot frees" in table
    assert path.exists()


def test_the_sweep_does_not_count_it_as_gone(stuck_rank: Stuck, isolated_environment: Path) -> None:
    path = record_of(stuck_rank, isolated_environment)
    report = sweep(fingerprint=False, grace=0, kill_wait=0.1)
    assert not report.results  # no signal reaches it on a Mac: none is sent
    assert [v.action for v in report.verdicts if v.pid == stuck_rank.pid] == ["spare"]
    assert path.exists()  # forgotten only once the process table no longer lists it


def test_doctor_shows_it_with_the_reboot_advice(
    stuck_rank: Stuck, isolated_environment: Path
) -> None:
    record_of(stuck_rank, isolated_environment)
    facts = doctor.gather(None)
    assert (stuck_rank.pid, "?") in facts.stuck
    (line,) = [check for check in doctor.assess(facts) if check.name == "unkillable"]
    assert line.status in ("WARN", "FAIL") and str(stuck_rank.pid) in line.detail
    assert "stuck or exiting" in line.detail and "reboot" in str(line.next_step)
