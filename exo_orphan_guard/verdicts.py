"""Decide, from a process-table snapshot and registry records, what a sweep may kill.

Pure: no system calls, so every rule is tested on made-up snapshots. A wrong kill on
a machine serving a 300 GB model is worse than the bug the sweep fixes, so a process
is only ever a target when one rule positively says so, and any doubt spares it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, final

from ._common import Pid
from .identity import ProcessIdentity
from .process_table import ProcessInfo, ProcessTable
from .registry import LoadedRecord

Action = Literal["kill", "spare", "forget"]
"""forget: the record is stale (its runner is gone, or its pid now belongs to another
process); the sweep deletes the record and never touches the process."""

Rule = Literal["registry", "registry-group", "fingerprint", "match", "match-any-parent"]


@final
@dataclass(frozen=True, slots=True)
class SweepOptions:
    fingerprint: bool = True
    """Also look for runners without a record (started before the guard)."""
    match: re.Pattern[str] | None = None
    """Also target processes whose command line matches, if reparented to pid 1..."""
    any_parent: bool = False
    """...or whatever their parent (mlx.launch ranks under a stuck sshd)."""


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


def decide(
    table: ProcessTable, records: Iterable[LoadedRecord], options: SweepOptions
) -> tuple[Verdict, ...]:
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
        verdict = _judge_unrecorded(table, process, options)
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
    process = table.processes.get(record.pid)
    if process is None or process.exited:
        return verdict("forget", "runner has exited")
    if process.started != record.started:
        return verdict("forget", "pid now belongs to another process (pid reuse)")
    protection = _protection(table, process)
    if protection is not None:
        return verdict("spare", protection, process)
    if record.uid != table.uid:
        return verdict("spare", f"recorded for uid {record.uid}", process)
    if process.argv != record.argv:
        return verdict(
            "spare", "command line differs from the record: not recognisably the runner", process
        )
    if record.worker == table.me:
        return verdict("spare", "runner of this worker", process)
    if _alive_in(table, record.worker):
        if options.any_parent and _matches(options, process):
            # A wrapped rank whose parent is a stuck sshd: the operator named it.
            reason = "command line matches --match (--any-parent); its parent lives"
            return Verdict(record.pid, "kill", reason, "match-any-parent", process, loaded, labels)
        return verdict("spare", f"its worker {record.worker.pid} is alive", process)
    return verdict("kill", f"its worker {record.worker.pid} is gone", process)


def _group_leftovers(table: ProcessTable, forgotten: Verdict) -> list[Verdict]:
    """What a dead guarded runner started, still in the process group it led.

    The runner is gone (PR_SET_PDEATHSIG took it, say) but its children live on in its
    group. While any member lives, the kernel never hands the group's id out again, so
    a member of it is the dead runner's descendant for certain.
    """
    record = forgotten.record.record if forgotten.record is not None else None
    if record is None or record.pgid != record.pid or forgotten.process is not None:
        return []
    if record.boot_id != table.boot_id or _alive_in(table, record.worker):
        return []
    leader = table.processes.get(record.pid)
    if leader is not None and not leader.exited:
        return []  # the pid was reused: its group, if it leads one, is someone else's
    leftovers: list[Verdict] = []
    for process in table.processes.values():
        if process.pgid != record.pgid or process.exited:
            continue
        protection = _protection(table, process)
        action: Action = "spare" if protection is not None else "kill"
        reason = protection or f"left in the group of dead runner {record.pid} (worker gone)"
        rule: Rule | None = "registry-group" if action == "kill" else None
        leftovers.append(
            Verdict(process.pid, action, reason, rule, process, forgotten.record, record.labels)
        )
    return leftovers


def _alive_in(table: ProcessTable, identity: ProcessIdentity) -> bool:
    process = table.processes.get(identity.pid)
    return process is not None and not process.exited and process.started == identity.started


def _judge_unrecorded(
    table: ProcessTable, process: ProcessInfo, options: SweepOptions
) -> Verdict | None:
    matched = _matches(options, process)
    runner_like = options.fingerprint and process.is_spawn_child and process.runs_exo
    if not (matched or runner_like) or process.exited:
        return None

    def verdict(action: Action, reason: str, rule: Rule | None = None) -> Verdict:
        return Verdict(process.pid, action, reason, rule if action == "kill" else None, process)

    protection = _protection(table, process)
    if protection is not None:
        return verdict("spare", protection)
    parent = table.processes.get(Pid(process.ppid))
    parent_alive = parent is not None and not parent.exited
    if not runner_like and _queries_the_guard(process.argv):
        return verdict("spare", "an exo-orphan-guard scan/sweep/doctor (or the ssh running one)")
    if runner_like:
        if parent is not None and parent_alive and parent.runs_exo:
            return verdict("spare", f"its parent {process.ppid} is a live exo process")
        parent_text = "gone" if not parent_alive else f"{process.ppid}, not exo"
        return verdict("kill", f"exo spawn child whose parent is {parent_text}", "fingerprint")
    if options.any_parent:
        return verdict("kill", "command line matches --match (--any-parent)", "match-any-parent")
    if process.ppid <= 1 or not parent_alive:
        return verdict("kill", "command line matches --match and it was reparented", "match")
    return verdict(
        "spare", f"matches --match but its parent {process.ppid} is alive (see --any-parent)"
    )


def _matches(options: SweepOptions, process: ProcessInfo) -> bool:
    return options.match is not None and options.match.search(" ".join(process.argv)) is not None


def _queries_the_guard(argv: Sequence[str]) -> bool:
    """Whether this runs `exo-orphan-guard scan|sweep|doctor`, itself or through ssh.

    `--match` sees whole command lines, and a `sweep --hosts` that reaches this very
    host has the regex in its own argv and in its ssh clients': never kill those.
    """
    words = " ".join(argv).split()
    for index, word in enumerate(words):
        if word.rsplit("/", 1)[-1] not in _GUARD_PROGRAMS:
            continue
        command = next((later for later in words[index + 1 :] if not later.startswith("-")), "")
        if command in _GUARD_QUERIES:
            return True
    return False


_GUARD_PROGRAMS = frozenset({"exo-orphan-guard", "exo_orphan_guard"})
_GUARD_QUERIES = frozenset({"scan", "sweep", "doctor"})


def _protection(table: ProcessTable, process: ProcessInfo) -> str | None:
    if process.pid in table.protected:
        return "this process, one of its ancestors or descendants"
    if process.uid != table.uid:
        return f"owned by uid {process.uid}, not {table.uid}"
    return None
