"""One cheap scan judged beside full ones (`agree`), for the tests of the guardian's
cheap scan against real process tables, and the processes those tests start."""

from __future__ import annotations

import subprocess
from typing import Final

from exo_orphan_guard.guardian import watchlist
from exo_orphan_guard.guardian.cheap_scan import CheapScan
from exo_orphan_guard.sweeper.judging import judge
from exo_orphan_guard.sweeper.process_table import SPAWN_CHILD_FLAG, ProcessTable
from exo_orphan_guard.sweeper.verdicts import SweepOptions, Verdict
from exo_orphan_guard.system.identity import ProcessIdentity

OPTIONS: Final = SweepOptions(fingerprint=True)
SLEEP: Final = "import time; time.sleep(120)"
_TRIES: Final = 3

Said = tuple[tuple[int, str, str, str | None], ...]
Watched = dict[ProcessIdentity, frozenset[ProcessIdentity]]


def _said(verdicts: tuple[Verdict, ...]) -> Said:
    return tuple(sorted((v.pid, v.action, v.reason, v.rule) for v in verdicts))


def _full() -> tuple[Said, Watched]:
    table, verdicts = judge(None, OPTIONS, [])
    return _said(verdicts), _watched(table, verdicts)


def _watched(table: ProcessTable, verdicts: tuple[Verdict, ...]) -> Watched:
    return watchlist.exo_processes(table, verdicts)


def _cheap(scan: CheapScan) -> tuple[Said, Watched]:
    table, verdicts = judge(None, OPTIONS, [], scan.candidates(), scan.memo)
    return _said(verdicts), _watched(table, verdicts)


def agree(scan: CheapScan) -> Said:
    return agreed(scan)[0]


def agreed(scan: CheapScan) -> tuple[Said, Watched]:
    """One cheap scan (with its memo, as the guardian's), judged beside full ones: the
    same verdicts and watch list. A full scan before and after it that disagree mean
    the table changed meanwhile (a process of an earlier test leaving): then again,
    with another scan, so that what the first scan found is not what `scan` holds."""
    for _ in range(_TRIES):
        before = _full()
        cheap = _cheap(scan)
        after = _full()
        if before == after:
            assert cheap == before, f"cheap {cheap}\nfull {before}"
            return cheap
    raise AssertionError(f"the process table kept changing over {_TRIES} tries")


def pids_said(said: Said) -> set[int]:
    return {pid for pid, _, _, _ in said}


def start(
    processes: list[subprocess.Popen[bytes]],
    argv: list[str],
    stdin: int | None = None,
    stdout: int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, stdin=stdin, stdout=stdout)
    processes.append(process)
    return process


def runner_argv(exo_python: str) -> list[str]:
    return [exo_python, "-c", SLEEP, SPAWN_CHILD_FLAG]
