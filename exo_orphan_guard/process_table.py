"""A snapshot of the processes a sweep may need to judge, and nothing more.

Reading everything about every process is what makes `psutil.process_iter` slow on a
busy Mac. A sweep reads each process's command line once (cheap, straight from /proc
on Linux), keeps the few that could be runners, and only then asks psutil for details
about those, their parents, recorded runners and their workers.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar, final

import psutil

from . import system
from ._common import MemoryUsage, Pid
from .exo_detect import ExoExecutables
from .identity import ProcessIdentity, current_identity

SPAWN_CHILD_FLAG: Final = "--multiprocessing-fork"
_SPAWN_CHILD_WORD: Final = SPAWN_CHILD_FLAG.encode()
T = TypeVar("T")
_MAX_DEPTH: Final = 256


@final
@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: Pid
    ppid: int
    started: float
    uid: int
    argv: tuple[str, ...]
    exe: str | None
    status: str
    rss: int | None
    create_time: float
    runs_exo: bool
    pgid: int | None = None
    memory: MemoryUsage | None = None
    """Physical footprint on macOS (RSS hides Metal memory there), RSS elsewhere."""

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.started)

    @property
    def exited(self) -> bool:
        return self.status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)

    @property
    def is_spawn_child(self) -> bool:
        return SPAWN_CHILD_FLAG in self.argv

    def age_seconds(self, now: float) -> float:
        return max(0.0, now - self.create_time)


@final
@dataclass(frozen=True, slots=True)
class ProcessTable:
    processes: Mapping[Pid, ProcessInfo]
    me: ProcessIdentity
    uid: int
    protected: frozenset[int]
    """This process, its ancestors and its descendants: never killed by its own sweep."""
    boot_id: str
    taken_at: float


def gather(
    interesting: Iterable[int],
    *,
    fingerprint: bool,
    match: re.Pattern[str] | None,
    groups: Collection[int] = (),
) -> ProcessTable:
    """Snapshot `interesting` pids, plus spawn children (`fingerprint`) or processes
    whose command line matches `match`, plus members of process `groups`, plus the
    parents of all of those."""
    wanted: set[int] = set(interesting)
    if fingerprint or match is not None:
        wanted.update(_scan_command_lines(fingerprint, match))
    if groups:
        wanted.update(system.group_members(groups))
    processes: dict[Pid, ProcessInfo] = {}
    for pid in sorted(wanted):
        info = _describe(pid)
        if info is not None:
            processes[info.pid] = info
    # Parents decide whether a spawn child is an orphan: describe them too.
    for info in list(processes.values()):
        if info.ppid > 0 and info.ppid not in processes:
            parent = _describe(info.ppid)
            if parent is not None:
                processes[parent.pid] = parent
    _mark_exo(processes)
    me = current_identity()
    return ProcessTable(
        processes=processes,
        me=me,
        uid=os.geteuid(),
        protected=frozenset(_protected(me.pid, processes)),
        boot_id=system.boot_id(),
        taken_at=time.time(),
    )


def _mark_exo(processes: dict[Pid, ProcessInfo]) -> None:
    """Look on disk only where the fingerprint rule needs it: spawn children and
    their parents."""
    exo = ExoExecutables()
    for info in list(processes.values()):
        if not info.is_spawn_child:
            continue
        for pid in (info.pid, Pid(info.ppid)):
            process = processes.get(pid)
            if (
                process is not None
                and not process.runs_exo
                and exo.recognises(process.argv, process.exe)
            ):
                processes[pid] = dataclasses.replace(process, runs_exo=True)


def _scan_command_lines(fingerprint: bool, match: re.Pattern[str] | None) -> list[int]:
    found: list[int] = []
    for pid, raw in system.iter_command_lines():
        words = raw.rstrip(b"\0").split(b"\0")
        if fingerprint and _SPAWN_CHILD_WORD in words:
            found.append(pid)
        elif match is not None:
            line = " ".join(word.decode(errors="replace") for word in words)
            if match.search(line):
                found.append(pid)
    return found


def _describe(pid: int) -> ProcessInfo | None:
    try:
        start = system.read_start(pid)
    except PermissionError:
        start = None
    if start is None:
        return None
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            ppid = process.ppid()
            uid = process.uids().effective
            status = process.status()
            create_time = process.create_time()
            argv = _or_empty(process.cmdline)
            exe = _or_none(process.exe)
            rss = _or_none(lambda: process.memory_info().rss)
        pgid = os.getpgid(pid)
    except (psutil.Error, ProcessLookupError):
        return None
    memory = system.memory_usage(pid)
    return ProcessInfo(
        pid=Pid(pid),
        ppid=ppid,
        started=start.started,
        uid=uid,
        argv=tuple(argv),
        exe=exe or None,
        status=psutil.STATUS_ZOMBIE if start.exited else status,
        rss=rss,
        create_time=create_time,
        runs_exo=False,
        pgid=pgid,
        memory=memory,
    )


def _or_empty(read: Callable[[], list[str]]) -> list[str]:
    try:
        return read()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _or_none(read: Callable[[], T]) -> T | None:
    try:
        return read()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _protected(me: int, processes: Mapping[Pid, ProcessInfo]) -> set[int]:
    """`me`, its ancestors, and those of `processes` that descend from it: found by
    walking up from each (a few steps), never by walking down the whole tree."""
    ancestors = _ancestry(me)
    protected = {me, *ancestors}
    for pid in processes:
        if me in _ancestry(pid):
            protected.add(pid)
    return protected


def _ancestry(pid: int) -> list[int]:
    chain: list[int] = []
    current: int | None = pid
    while current is not None and current > 1 and len(chain) < _MAX_DEPTH:
        current = system.parent_pid(current)
        if current is not None and current > 0:
            chain.append(current)
    return chain
