"""Made-up process-table snapshots and registry records, for tests of `decide`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from exo_orphan_guard.records.registry import LoadedRecord, RunnerRecord
from exo_orphan_guard.sweeper.process_table import ProcessInfo, ProcessTable
from exo_orphan_guard.sweeper.verdicts import SweepOptions, Verdict
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid

ME = ProcessIdentity(Pid(100), 50.0)
UID = 501
BOOT = "boot-a"
EXO_PY = "/Users/me/exo/.venv/bin/python"
RUNNER_ARGV = (
    EXO_PY,
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(...)",
    "--multiprocessing-fork",
)
FROZEN_ARGV = (
    "/Applications/EXO.app/Contents/Resources/exo/exo",
    "--multiprocessing-fork",
    "tracker_fd=5",
    "pipe_handle=7",
)


EXO_EXTENSION = "/Users/me/exo/.venv/lib/python3.13/site-packages/exo_rs/exo_rs.abi3.so"
SHOWS_EXO = "maps exo's extension exo_rs.abi3.so"


def proc(
    pid: int,
    ppid: int = 1,
    *,
    argv: tuple[str, ...] = RUNNER_ARGV,
    exo: bool = True,
    environment: bool | None = None,
    uid: int = UID,
    started: float | None = None,
    status: str = "sleeping",
    pipes: frozenset[int] | None = None,
) -> ProcessInfo:
    """`exo`: it shows that it runs exo (exo's extension mapped, as exo's main process
    and the runners of its console script and frozen app do); `environment`: it runs
    from exo's environment (default: as `exo`), which alone proves nothing."""
    return ProcessInfo(
        pid=Pid(pid),
        ppid=ppid,
        started=float(pid) if started is None else started,
        uid=uid,
        argv=argv,
        exe=argv[0] if argv else None,
        status=status,
        rss=2**30,
        create_time=1000.0 + pid,
        pipes=pipes,
        exo_evidence=SHOWS_EXO if exo else None,
        in_exo_environment=exo if environment is None else environment,
    )


def table(
    *processes: ProcessInfo,
    protected: tuple[int, ...] = (),
    unreadable: tuple[int, ...] = (),
    pipes_visible: bool = False,
    scanned: bool = True,
) -> ProcessTable:
    return ProcessTable(
        processes={process.pid: process for process in processes},
        me=ME,
        uid=UID,
        protected=frozenset((ME.pid, *protected)),
        boot_id=BOOT,
        taken_at=5000.0,
        unreadable=frozenset(unreadable),
        scanned_groups=frozenset(range(1000)) if scanned else frozenset(),
        pipes_visible=pipes_visible,
    )


def record(
    pid: int,
    worker: ProcessIdentity,
    *,
    started: float | None = None,
    argv: tuple[str, ...] = RUNNER_ARGV,
    uid: int = UID,
    boot: str = BOOT,
) -> LoadedRecord:
    runner = RunnerRecord(
        pid=Pid(pid),
        started=float(pid) if started is None else started,
        boot_id=boot,
        uid=uid,
        worker=worker,
        exe=argv[0],
        argv=argv,
        pgid=pid,
        recorded_at=1.0,
        labels={"runner_id": f"r{pid}"},
    )
    return LoadedRecord(Path(f"/registry/runner-{pid}.json"), runner)


DEAD_WORKER = ProcessIdentity(Pid(200), 200.0)
DEFAULT = SweepOptions()


def by_pid(verdicts: tuple[Verdict, ...]) -> dict[int, Verdict]:
    return {verdict.pid: verdict for verdict in verdicts if verdict.action != "forget"}


def member(
    pid: int,
    pgid: int,
    *,
    started: float | None = None,
    marker: str | None = "300:300.0",
    readable: bool = True,
) -> ProcessInfo:
    process = proc(pid, argv=("/bin/sleep", "3600"), exo=False, started=started)
    return dataclasses.replace(process, pgid=pgid, runner_marker=marker, marker_readable=readable)
