"""A snapshot of the processes a sweep may need to judge, and nothing more.

Reading everything about every process is what makes `psutil.process_iter` slow on a
busy Mac. A sweep reads each process's command line once (cheap, straight from /proc
on Linux), keeps the few that could be runners, and only then asks for details
(`system.process_details`) about those, their parents, recorded runners and their
workers.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Final, Literal, final

from .. import system
from ..system.identity import ProcessIdentity, current_identity
from ..system.process_facts import DEAD, ZOMBIE, MemoryUsage, Pid
from ..system.settings import RUNNER_ENV
from .exo_detect import ExoExecutables
from .process_memo import ProcessMemo, Role

SPAWN_CHILD_FLAG: Final = "--multiprocessing-fork"
_SPAWN_CHILD_WORD: Final = SPAWN_CHILD_FLAG.encode()
GUARD_COMMAND: Final = "exo-orphan-guard"
_GUARD_MODULES: Final = frozenset({"exo_orphan_guard", "exo_orphan_guard.tools.cli"})
_MAX_DEPTH: Final = 256
EXITING: Final = "exiting"
"""The state of a process whose details vanished while the process table still lists
it: XNU refuses every per-process call (`proc_find`) once it starts tearing a process
down, and a rank stuck in a driver on its way out stays so, holding its memory."""


def is_guard_command(argv: Sequence[str]) -> bool:
    """Whether this is, or runs, an `exo-orphan-guard` command other than `exec`:
    another sweep or scan, or the ssh (or shell) carrying one to this host for a
    `sweep --hosts`. No sweep signals one, whatever `--match` says: both command lines
    hold the same regex. An `exec` wrapper is not spared: it is guarded and recorded
    like a runner, and judged like one."""
    words = [word for part in argv for word in part.split()] if argv else []
    for index, word in enumerate(words):
        if os.path.basename(word) == GUARD_COMMAND:
            rest = words[index + 1 :]
        elif word == "-m" and index + 1 < len(words) and words[index + 1] in _GUARD_MODULES:
            rest = words[index + 2 :]
        else:
            continue
        command = next((later for later in rest if not later.startswith("-")), "")
        return command != "exec"
    return False


@lru_cache(maxsize=256)
def _is_guard_argv(argv: tuple[str, ...]) -> bool:
    """`is_guard_command`, asked of the same few command lines at every scan."""
    return is_guard_command(argv)


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
    pgid: int | None = None
    pipes: frozenset[int] | None = None
    """Pipe inodes it holds, read for spawn children and their parents; None: unknown."""
    runner_marker: str | None = None
    """EXO_ORPHAN_GUARD_RUNNER from its environment: the guarded runner it descends from
    (read for members of dead runners' groups only)."""
    marker_readable: bool = False
    memory: MemoryUsage | None = None
    """Physical footprint on macOS (RSS hides Metal memory there), RSS elsewhere."""
    vanished: bool = False
    """Listed, but refused as no such process when asked for its details: exiting, or
    stuck in the kernel on its way out (`ps` shows `?E`). Never gone: its status is
    EXITING, its memory and group unknown, and no signal reaches it."""
    ignores_sigint: bool | None = None
    """Read for exo's spawn children (Linux only; None: unknown): a spawn child of a
    process started in the background from a script that set no SIGINT handler before
    spawning it inherits SIGINT ignored (exo's own process sets one first)."""
    exo_evidence: str | None = None
    """What shows that it runs exo (`exo_detect`), in words; None: nothing does, or it
    was not looked for. Read for spawn children whose parent shows none, and for the
    live parents of spawn children."""
    in_exo_environment: bool = False
    """Read for spawn children: its interpreter's environment has exo installed (or
    its binary is named `exo`). Resemblance, not evidence: such an orphan is listed as
    not known to be exo, never ended without `--match`."""

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.started)

    @property
    def exited(self) -> bool:
        return self.status in (ZOMBIE, DEAD)

    @property
    def is_spawn_child(self) -> bool:
        return SPAWN_CHILD_FLAG in self.argv

    @property
    def is_guard(self) -> bool:
        return _is_guard_argv(self.argv)

    @property
    def runs_exo(self) -> bool:
        return self.exo_evidence is not None

    def age_seconds(self, now: float) -> float:
        return max(0.0, now - self.create_time)


@final
@dataclass(frozen=True, slots=True)
class ProcessTable:
    processes: Mapping[Pid, ProcessInfo]
    me: ProcessIdentity
    uid: int
    protected: frozenset[int]
    """This process, its ancestors and its descendants: never killed by its own sweep.
    Also whatever could not be placed: a process whose ancestry cannot be read."""
    boot_id: str
    taken_at: float
    unreadable: frozenset[int] = frozenset()
    """Pids that exist but could not be read: never taken for gone."""
    scanned_groups: frozenset[int] = frozenset()
    """Process groups whose members were all read (with their environments)."""
    pipes_visible: bool = False
    """Whether `ProcessInfo.pipes` can be read here (Linux), so that a live parent
    holding none of a spawn child's pipes proves it is not the spawner."""


def gather(
    interesting: Iterable[int],
    *,
    fingerprint: bool,
    match: re.Pattern[str] | None,
    groups: Collection[int] = (),
    candidates: Collection[int] | None = None,
    memo: ProcessMemo | None = None,
) -> ProcessTable:
    """Snapshot `interesting` pids, plus spawn children (`fingerprint`) or processes
    whose command line matches `match`, plus members of process `groups`, plus the
    parents of all of those. `candidates`: the only pids to look at for the first two
    (the runners the guardian saw under a worker that died), instead of every command
    line: what `decide` then says of them is the same, in a few milliseconds. `memo`:
    what the guardian's earlier scans read that cannot have changed (`process_memo`)."""
    wanted: set[int] = set(interesting)
    if candidates is not None:
        wanted.update(candidates)
    elif fingerprint or match is not None:
        wanted.update(_scan_command_lines(fingerprint, match))
    members: set[int] = set(system.group_members(groups)) if groups else set()
    wanted.update(members)
    processes: dict[Pid, ProcessInfo] = {}
    unreadable: set[int] = set()

    def describe(pid: int) -> None:
        info = _describe(pid) if memo is None else memo.describe(pid, _describe)
        if info == "unreadable":
            unreadable.add(pid)
        elif info != "gone":
            processes[info.pid] = info

    for pid in sorted(wanted):
        describe(pid)
    # Parents decide whether a spawn child is an orphan: describe them too.
    for info in list(processes.values()):
        if info.ppid > 0 and info.ppid not in processes:
            describe(info.ppid)
    _mark_exo(processes, memo)
    _read_spawn_pipes(processes)
    _read_runner_markers(processes, groups)
    me = current_identity()
    protected = frozenset(_protected(me.pid, processes, memo))
    if memo is not None:
        memo.settle()
    return ProcessTable(
        processes=processes,
        me=me,
        uid=os.geteuid(),
        protected=protected,
        boot_id=system.boot_id(),
        taken_at=time.time(),
        unreadable=frozenset(unreadable),
        scanned_groups=frozenset(groups),
        pipes_visible=system.pipes_visible(),
    )


def _mark_exo(processes: dict[Pid, ProcessInfo], memo: ProcessMemo | None) -> None:
    """What shows exo, where the rules need it: in each live parent of a spawn child
    (exo's main process shows it however it was started), then in each spawn child
    whose parent shows none (an orphan, or one adopted by a subreaper or an init).
    What is cheap is asked first, the mapped files (the costliest read) last."""
    exo = ExoExecutables()
    children = [info for info in processes.values() if info.is_spawn_child and not info.exited]
    parents: dict[Pid, str | None] = {}
    for child in children:
        parent = processes.get(Pid(child.ppid))
        if parent is None or parent.pid in parents or not _may_be_spawner(parent):
            continue
        parents[parent.pid] = _evidence(exo, parent, "parent", memo)
    for pid, found in parents.items():
        processes[pid] = dataclasses.replace(processes[pid], exo_evidence=found)
    for child in children:
        exo_parent = parents.get(Pid(child.ppid)) is not None
        orphaned = Pid(child.ppid) not in parents
        found = None if exo_parent or child.vanished else _evidence(exo, child, "child", memo)
        environment = (
            exo.in_environment(child.argv, child.exe)
            if memo is None
            else memo.environment(child.pid, partial(exo.in_environment, child.argv, child.exe))
        )
        ignores = _ignores_sigint(child.pid, memo) if found or orphaned or environment else None
        current = processes[child.pid]  # its own evidence, if it is a parent too
        processes[child.pid] = dataclasses.replace(
            current,
            exo_evidence=found or current.exo_evidence,
            in_exo_environment=environment,
            ignores_sigint=ignores,
        )


def _evidence(
    exo: ExoExecutables, info: ProcessInfo, role: Role, memo: ProcessMemo | None
) -> str | None:
    def look() -> str | None:
        return exo.evidence(info.argv, info.exe, _mapped(info.pid), alive_parent=role == "parent")

    return look() if memo is None else memo.evidence(info.pid, role, look)


def _ignores_sigint(pid: Pid, memo: ProcessMemo | None) -> bool | None:
    known = None if memo is None else memo.ignores_sigint(pid)
    return system.ignores_signal(pid, signal.SIGINT) if known is None else known


def _may_be_spawner(info: ProcessInfo) -> bool:
    return info.pid > 1 and not info.exited and not info.vanished


def _mapped(pid: int) -> Callable[[], frozenset[str] | None]:
    return lambda: system.mapped_files(pid)


def _read_spawn_pipes(processes: dict[Pid, ProcessInfo]) -> None:
    """Pipes of spawn children that show exo themselves (or run from its environment)
    and have a live parent that does not, and of that parent: whether it spawned them
    or only adopted them."""
    if not system.pipes_visible():
        return
    for info in list(processes.values()):
        parent = processes.get(Pid(info.ppid))
        if not (info.runs_exo or info.in_exo_environment) or info.exited:
            continue
        if parent is None or parent.exited or parent.runs_exo:
            continue
        for pid in (info.pid, parent.pid):
            process = processes[pid]
            if process.pipes is None:
                processes[pid] = dataclasses.replace(process, pipes=system.pipe_inodes(pid))


def _read_runner_markers(processes: dict[Pid, ProcessInfo], groups: Collection[int]) -> None:
    for info in list(processes.values()):
        if info.pgid not in groups:
            continue
        try:
            marker = system.environment_value(info.pid, RUNNER_ENV)
        except PermissionError:
            continue
        processes[info.pid] = dataclasses.replace(info, runner_marker=marker, marker_readable=True)


def is_spawn_candidate(raw: bytes) -> bool:
    """Whether the fingerprint rule's pass over every command line picks this one (raw,
    as `system.iter_command_lines` yields it): a spawn child's, or one that vanished."""
    return not raw or _SPAWN_CHILD_WORD in raw.rstrip(b"\0").split(b"\0")


def _scan_command_lines(fingerprint: bool, match: re.Pattern[str] | None) -> list[int]:
    found: list[int] = []
    for pid, raw in system.iter_command_lines():
        if not raw or (fingerprint and is_spawn_candidate(raw)):
            found.append(pid)  # an empty one vanished while listed: it may be a runner
        elif match is not None:
            words = raw.rstrip(b"\0").split(b"\0")
            line = " ".join(word.decode(errors="replace") for word in words)
            if match.search(line):
                found.append(pid)
    return found


def _describe(pid: int) -> ProcessInfo | Literal["gone", "unreadable"]:
    """What the snapshot knows of `pid`. Only the process table decides "gone": a
    detail refused as no such process while the table still lists the process makes
    it `vanished`, and any other failure leaves that detail unknown."""
    try:
        start = system.read_start(pid)
    except PermissionError:
        return "unreadable"
    if start is None:
        return "gone"
    try:
        details = system.process_details(pid)
    except PermissionError:
        return "unreadable"
    if details is None:
        return "gone" if _unlisted(pid) else "unreadable"
    status = details.status
    exited = start.exited
    vanished = details.refused
    if vanished:
        try:
            again = system.read_start(pid)
        except PermissionError:
            return "unreadable"
        if again is None:
            return "gone"
        exited = again.exited
        vanished = not exited
    if vanished:
        status = EXITING
    elif exited:
        status = ZOMBIE
    known = not vanished
    return ProcessInfo(
        pid=Pid(pid),
        ppid=details.ppid,
        started=start.started,
        uid=details.uid,
        argv=details.argv or (),
        exe=details.exe,
        status=status,
        rss=details.rss if known else None,
        create_time=details.create_time,
        pgid=details.pgid if known else None,
        memory=system.memory_usage(pid) if known else None,
        vanished=vanished,
    )


def _unlisted(pid: int) -> bool:
    try:
        return system.read_start(pid) is None
    except PermissionError:
        return False


def _protected(me: int, processes: Mapping[Pid, ProcessInfo], memo: ProcessMemo | None) -> set[int]:
    """`me`, its ancestors, and those of `processes` that descend from it (or whose
    ancestry cannot be read): found by walking up from each (a few steps), never by
    walking down the whole tree; not again for one `memo` found outside."""
    protected = {me, *(_ancestry(me) or ())}
    for pid in processes:
        if memo is not None and memo.outside(pid):
            continue
        ancestry = _ancestry(pid)
        if ancestry is None or me in ancestry:
            protected.add(pid)
        elif memo is not None and pid != me:
            memo.found_outside(pid)
    return protected


def _ancestry(pid: int) -> list[int] | None:
    """Parent, grandparent, ... up to pid 1; None if a link cannot be read."""
    chain: list[int] = []
    current: int | None = pid
    while current is not None and current > 1 and len(chain) < _MAX_DEPTH:
        try:
            current = system.parent_pid(current)
        except PermissionError:
            return None
        if current is not None and current > 0:
            chain.append(current)
    return chain
