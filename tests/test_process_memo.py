"""The guardian's scans keep what cannot change of a process only while it is the same
process running the same program: the memo's rules on a made-up process (its stat
read stands in for `system.process_state`). On real processes: test_cheap_scan."""

from __future__ import annotations

from typing import Literal

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.sweeper.process_memo import ProcessMemo
from exo_orphan_guard.sweeper.process_table import ProcessInfo
from exo_orphan_guard.system.process_facts import Image, Pid, ProcessStart, ProcessState

PID = Pid(4321)
STARTED = 100.0
IMAGE: Image = ("python", ("python", "-m", "exo"))


class Table:
    """What the made-up process shows now, and how often it was read in full."""

    def __init__(self) -> None:
        self.started = STARTED
        self.image: Image | None = IMAGE
        self.ppid = 10
        self.exited = False
        self.full_reads = 0

    def state(self, pid: int) -> ProcessState | None:
        assert pid == PID
        start = ProcessStart(self.started, self.exited)
        return ProcessState(start, self.ppid, "sleeping", 7, 1024, None, self.image)

    def full(self, pid: int) -> ProcessInfo | Literal["gone", "unreadable"]:
        self.full_reads += 1
        return ProcessInfo(
            pid=Pid(pid),
            ppid=self.ppid,
            started=self.started,
            uid=501,
            argv=("python", "-m", "exo"),
            exe="python",
            status="zombie" if self.exited else "sleeping",
            rss=1024,
            create_time=1.0,
            pgid=7,
        )


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Table:
    made_up = Table()
    monkeypatch.setattr(system, "process_state", made_up.state)
    return made_up


def scan(memo: ProcessMemo, table: Table, evidence: str | None = None) -> ProcessInfo:
    info = memo.describe(PID, table.full)
    assert not isinstance(info, str)
    if evidence is not None:
        assert memo.evidence(PID, "parent", lambda: evidence) == evidence
    memo.settle()
    return info


def test_what_cannot_change_is_read_once_and_what_can_at_every_scan(table: Table) -> None:
    memo = ProcessMemo()
    scan(memo, table, evidence="maps exo's extension")
    table.ppid = 1  # its parent died: reparented
    info = scan(memo, table)
    assert table.full_reads == 1 and info.ppid == 1
    assert memo.describe(PID, table.full) != "gone"
    assert memo.evidence(PID, "parent", lambda: None) == "maps exo's extension"


def test_evidence_found_as_a_live_parent_is_never_a_childs(table: Table) -> None:
    """A live parent's command line counts, a child's does not."""
    memo = ProcessMemo()
    memo.describe(PID, table.full)
    assert memo.evidence(PID, "parent", lambda: "runs exo: python -m exo") is not None
    assert memo.evidence(PID, "child", lambda: None) is None


@pytest.mark.parametrize("change", ["exec", "pid reused", "exited", "no image"])
def test_a_new_image_a_new_process_or_an_exit_is_read_in_full(table: Table, change: str) -> None:
    memo = ProcessMemo()
    scan(memo, table, evidence="maps exo's extension")
    if change == "exec":
        table.image = ("python", ("python", "-c", "pass"))
    elif change == "pid reused":
        table.started = STARTED + 1
    elif change == "exited":
        table.exited = True
    else:
        table.image = None
    scan(memo, table)
    assert table.full_reads == 2
    assert memo.describe(PID, table.full) != "gone"
    assert memo.evidence(PID, "parent", lambda: None) is None


def test_a_process_a_scan_did_not_describe_is_forgotten(table: Table) -> None:
    memo = ProcessMemo()
    scan(memo, table, evidence="maps exo's extension")
    memo.settle()  # a scan that did not describe it
    scan(memo, table)
    assert table.full_reads == 2
