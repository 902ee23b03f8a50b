"""Decide, from a process-table snapshot and registry records, what a sweep may kill.

Pure: no system calls, so every rule is tested on made-up snapshots. A wrong kill on
a machine serving a 300 GB model is worse than the bug the sweep fixes, so a process
is only ever a target when one rule positively says so, and any doubt spares it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, final

from ..records import sightings as seen
from ..records.registry import LoadedRecord
from ..records.sightings import Sightings
from ..system.identity import ProcessIdentity
from ..system.process_facts import Pid
from .process_table import ProcessInfo, ProcessTable

Action = Literal["kill", "spare", "forget"]
"""forget: the record is stale (its runner is gone, or its pid now belongs to another
process); the sweep deletes the record and never touches the process."""

Rule = Literal["registry", "registry-group", "fingerprint", "match", "match-any-parent"]

EXITING_REASON: Final = (
    "exiting or stuck in the kernel: listed, but its details vanished (ps: ?E), and no "
    "signal reaches it; if a later scan still lists it, only a reboot frees its memory"
)
NOT_KNOWN_EXO: Final = "orphaned, not known to be exo"
"""The start of the reason given to a spawn child of a dead (or adopting) parent that
runs from exo's environment but shows nothing of exo's and was never seen under a
live exo: listed by `scan` and `doctor`, ended only by an explicit `--match`."""


@final
@dataclass(frozen=True, slots=True)
class SweepOptions:
    fingerprint: bool = True
    """Also look for runners without a record (started before the guard)."""
    match: re.Pattern[str] | None = None
    """Also target processes whose command line matches, if reparented to pid 1..."""
    any_parent: bool = False
    """...or whatever their parent (mlx.launch ranks under a stuck sshd)."""
    all_users: bool = False
    """Also other users' unrecorded processes (root only; never the default)."""


@final
@dataclass(frozen=True, slots=True)
class Verdict:
    pid: Pid
    action: Action
    reason: str
    rule: Rule | None = None
    process: ProcessInfo | None = None
    record: LoadedRecord | None = None
    labels: Mapping[str, str] = field(default_factory=dict[str, str])
    again: bool = False
    """Judge once more: what decides this changed while the snapshot was taken."""
    not_known_exo: bool = False
    """Spared as orphaned, not known to be exo (`NOT_KNOWN_EXO`): listed, never ended
    without `--match`."""


def decide(
    table: ProcessTable,
    records: Iterable[LoadedRecord],
    options: SweepOptions,
    sightings: Sightings = seen.NONE,
) -> tuple[Verdict, ...]:
    """`sightings`: the exo processes the guardian saw alive, with their runners."""
    verdicts: dict[Pid, Verdict] = {}
    forgotten: list[Verdict] = []
    for loaded in records:
        verdict = _judge_record(table, loaded, options)
        if verdict.action == "forget":
            forgotten.append(verdict)
        else:
            verdicts[verdict.pid] = verdict
    for verdict in forgotten:
        for leftover in _group_leftovers(table, verdict):
            verdicts.setdefault(leftover.pid, leftover)
    for process in table.processes.values():
        if process.pid in verdicts:
            continue
        verdict = _judge_unrecorded(table, process, options, sightings)
        if verdict is not None:
            verdicts[process.pid] = verdict
    return (*verdicts.values(), *forgotten)


def _judge_record(table: ProcessTable, loaded: LoadedRecord, options: SweepOptions) -> Verdict:
    record = loaded.record
    labels = dict(record.labels)

    def verdict(action: Action, reason: str, process: ProcessInfo | None = None) -> Verdict:
        rule: Rule | None = "registry" if action == "kill" else None
        return Verdict(record.pid, action, reason, rule, process, loaded, labels)

    if record.boot_id != table.boot_id:
        return verdict("forget", "recorded before the last reboot")
    if record.pid in table.unreadable:
        return verdict("spare", "cannot read the process now holding its pid")
    process = table.processes.get(record.pid)
    if process is None or process.exited:
        if record.pgid == record.pid and record.pgid not in table.scanned_groups:
            # It died after the sweep chose which groups to read: keep the record
            # until a pass has judged what it left in its group. Whatever the snapshot
            # says of its worker: read before the runner, a worker seen alive may have
            # died since and taken the runner with it (PR_SET_PDEATHSIG).
            reason = "runner has exited; its group is judged on the next pass"
            return Verdict(record.pid, "spare", reason, None, None, loaded, labels, again=True)
        return verdict("forget", "runner has exited")
    if process.started != record.started:
        return verdict("forget", "pid now belongs to another process (pid reuse)")
    protection = _protection(table, process, all_users=False)
    if protection is not None:
        return verdict("spare", protection, process)
    if record.uid != table.uid:
        return verdict("spare", f"recorded for uid {record.uid}", process)
    if process.vanished:
        return verdict("spare", EXITING_REASON, process)
    if not process.argv:
        return verdict("spare", "its command line cannot be read now", process)
    if process.argv != record.argv:
        return verdict(
            "spare", "command line differs from the record: not recognisably the runner", process
        )
    if record.worker == table.me:
        return verdict("spare", "runner of this worker", process)
    if _maybe_alive(table, record.worker):
        if options.any_parent and _matches(options, process):
            # A wrapped rank whose parent is a stuck sshd: the operator named it.
            reason = "command line matches --match (--any-parent); its parent lives"
            return Verdict(record.pid, "kill", reason, "match-any-parent", process, loaded, labels)
        return verdict("spare", f"its worker {record.worker.pid} is alive", process)
    return verdict("kill", f"its worker {record.worker.pid} is gone", process)


def _group_leftovers(table: ProcessTable, forgotten: Verdict) -> list[Verdict]:
    """What a dead guarded runner started, still in the process group it led.

    The group id alone proves nothing: once the group empties, the runner's pid (and
    with it the group id) can be handed to a new process that leads a group of its
    own. So a member counts only with proof of descent: it started no earlier than
    the runner, and it carries the runner's identity in the environment it inherited
    (`guard_runner` sets it before anything is started). Where environments cannot be
    read (macOS), members are spared.
    """
    record = forgotten.record.record if forgotten.record is not None else None
    if record is None or record.pgid != record.pid or forgotten.process is not None:
        return []
    if record.boot_id != table.boot_id or _maybe_alive(table, record.worker):
        return []
    holder = table.processes.get(record.pid)
    if record.pid in table.unreadable or (holder is not None and holder.started != record.started):
        return []  # the pid was reused: its group, if it leads one, is someone else's
    marker = record.identity.encode()
    leftovers: list[Verdict] = []
    for process in table.processes.values():
        if process.pgid != record.pgid or process.exited:
            continue
        protection = _protection(table, process, all_users=False)
        if protection is not None:
            reason = protection
        elif not process.marker_readable:
            reason = f"in the group of dead runner {record.pid}, but its descent cannot be read"
        elif process.runner_marker != marker or process.started < record.started:
            reason = f"in the group of dead runner {record.pid}, but not started by it"
        else:
            leftovers.append(
                Verdict(
                    process.pid,
                    "kill",
                    f"started by dead runner {record.pid}, left in its group (worker gone)",
                    "registry-group",
                    process,
                    forgotten.record,
                    record.labels,
                )
            )
            continue
        leftovers.append(
            Verdict(process.pid, "spare", reason, None, process, forgotten.record, record.labels)
        )
    return leftovers


def _maybe_alive(table: ProcessTable, identity: ProcessIdentity) -> bool:
    """Alive, or impossible to tell: doubt keeps a worker alive."""
    if identity.pid in table.unreadable:
        return True
    process = table.processes.get(identity.pid)
    return process is not None and not process.exited and process.started == identity.started


def _judge_unrecorded(
    table: ProcessTable, process: ProcessInfo, options: SweepOptions, sightings: Sightings
) -> Verdict | None:
    matched = _matches(options, process)
    spawned = options.fingerprint and process.is_spawn_child
    if not (matched or spawned or process.vanished) or process.exited:
        return None

    def verdict(action: Action, reason: str, rule: Rule | None = None) -> Verdict:
        return Verdict(process.pid, action, reason, rule if action == "kill" else None, process)

    protection = _protection(table, process, all_users=options.all_users)
    if process.vanished:
        # Named by no rule (its command line may be gone too), but it may be a rank that
        # survived SIGKILL: shown, never signalled.
        return None if protection is not None else verdict("spare", EXITING_REASON)
    if protection is not None:
        return verdict("spare", protection)
    if process.ppid in table.unreadable:
        return verdict("spare", f"cannot read its parent {process.ppid}")
    runner = _group_leader_with_its_command(table, process)
    if runner is not None:
        # A watchdog that took over from a dead one was its understudy: a fork of the
        # watchdog, now init's, but still in its live runner's group.
        return verdict("spare", f"in the process group of live runner {runner.pid}, a fork of it")
    parent = table.processes.get(Pid(process.ppid))
    parent_alive = parent is not None and not parent.exited
    if spawned:
        judged = _judge_spawn_child(table, process, parent, sightings)
        if judged is not None:
            action, reason = judged
            return verdict(action, reason, "fingerprint")
    if matched:
        if options.any_parent:
            reason = "command line matches --match (--any-parent)"
            return verdict("kill", reason, "match-any-parent")
        if process.ppid <= 1 or not parent_alive:
            return verdict("kill", "command line matches --match and it was reparented", "match")
        return verdict(
            "spare", f"matches --match but its parent {process.ppid} is alive (see --any-parent)"
        )
    if not process.in_exo_environment:
        return None
    if parent is not None and parent_alive and _adopted_by(table, process, parent) is None:
        return verdict("spare", f"its parent {parent.pid} is alive and may be its spawner")
    reason = (
        f"{NOT_KNOWN_EXO}: a spawn child from exo's environment whose spawner is gone, but "
        "nothing shows it runs exo (end it with sweep --match)"
    )
    return Verdict(process.pid, "spare", reason, None, process, not_known_exo=True)


def _judge_spawn_child(
    table: ProcessTable, process: ProcessInfo, parent: ProcessInfo | None, sightings: Sightings
) -> tuple[Action, str] | None:
    """What the evidence says of a spawn child: a runner of exo seen by the guardian
    under an exo now gone, or showing exo itself with its spawner gone (kill); a runner
    of a live exo, or one whose live parent may be its spawner (spare); or nothing
    (None): no evidence names it exo's."""
    exo = seen.seen_under(sightings, process.identity)
    if exo is not None:
        if _maybe_alive(table, exo):
            return "spare", f"runner of exo {exo.pid}, which is alive"
        return "kill", f"runner of exo {exo.pid} (seen alive by the guardian), which is gone"
    parent_alive = parent is not None and not parent.exited
    if parent is not None and parent_alive and parent.runs_exo:
        return "spare", f"runner of exo {parent.pid}, which is alive ({parent.exo_evidence})"
    if not process.runs_exo:
        return None
    if parent is None or not parent_alive:
        return "kill", f"exo runner ({process.exo_evidence}) whose parent is gone"
    adopted = _adopted_by(table, process, parent)
    if adopted is None:
        return "spare", f"its parent {parent.pid} is alive and may be its spawner"
    return "kill", f"exo runner ({process.exo_evidence}) adopted by {parent.pid}: {adopted}"


def _matches(options: SweepOptions, process: ProcessInfo) -> bool:
    return options.match is not None and options.match.search(" ".join(process.argv)) is not None


def _group_leader_with_its_command(table: ProcessTable, process: ProcessInfo) -> ProcessInfo | None:
    """The live leader of `process`'s group if it runs the same command line (a
    guarded runner, of which `process` is a fork: its watchdog, whatever its parent)."""
    if process.pgid is None or process.pgid == process.pid:
        return None
    leader = table.processes.get(Pid(process.pgid))
    if leader is None or leader.exited or leader.pgid != leader.pid:
        return None
    return leader if leader.argv == process.argv and leader.uid == process.uid else None


def _adopted_by(table: ProcessTable, child: ProcessInfo, parent: ProcessInfo) -> str | None:
    """Why live `parent` is certainly not the process that spawned `child`, or None.

    A spawn child is only ever reparented when its spawner dies: to pid 1, or on Linux
    to a subreaper. A spawner has the child's user (spawning changes no uid), holds the
    read end of the child's sentinel pipe for as long as the child lives, and is a
    Python program (or exo's frozen app) itself.
    """
    if parent.uid != child.uid:
        return f"uid {parent.uid} cannot have spawned a process of uid {child.uid}"
    if parent.argv == child.argv:
        return None  # a fork of its live parent (a runner's watchdog, say): not adopted
    if table.pipes_visible and child.pipes is not None and parent.pipes is not None:
        if not child.pipes & parent.pipes:
            return "it holds none of the child's pipes, so it did not spawn it (a subreaper)"
        # A shared pipe alone proves nothing: an init (or any process) holds the stdout
        # its children inherited, and an orphan of v1.0.71 inherited exo's.
    elif not table.pipes_visible and parent.pid != 1:
        return None  # no subreapers outside Linux: a live parent other than init spawned it
    if _could_spawn(parent, child):
        return None
    return f"{_program(parent)} is not a Python program, so it did not spawn it"


def _could_spawn(parent: ProcessInfo, child: ProcessInfo) -> bool:
    """Whether `parent` may run multiprocessing: doubt (nothing readable) says yes."""
    if not parent.argv or not child.argv:
        return True
    program = os.path.basename(parent.argv[0])
    return (
        program.startswith("python")
        or program == os.path.basename(child.argv[0])
        or (parent.exe is not None and parent.exe == child.exe)
    )


def _program(process: ProcessInfo) -> str:
    return os.path.basename(process.argv[0]) if process.argv else str(process.pid)


def _protection(table: ProcessTable, process: ProcessInfo, *, all_users: bool) -> str | None:
    if process.pid in table.protected:
        return "this process, one of its ancestors or descendants"
    if process.is_guard:
        return "an exo-orphan-guard process (another sweep or a wrapper)"
    if process.uid != table.uid and not all_users:
        return f"owned by uid {process.uid}, not {table.uid}"
    return None
