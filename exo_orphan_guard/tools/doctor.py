"""`exo-orphan-guard doctor`: one screen about this node, each line OK / WARN / FAIL.

It changes nothing: it reads the environment, the registry, the process table and,
with `--exo PATH`, the exo checkout, and says what to run next. The checks are pure
functions of what was read (`assess`), so each verdict is tested on made-up facts.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from .. import system
from ..exo import patching
from ..records import endings
from ..records.endings import Ending
from ..records.registry import Registry
from ..sweeper.judging import judge
from ..sweeper.process_table import ProcessInfo, ProcessTable
from ..sweeper.verdicts import SweepOptions, Verdict
from ..system import settings
from ..system.process_facts import Pid, WiredMemory
from . import (
    bounds_check,
    hard_kills,
    rdma_ports,
    service_control,
    service_files,
    service_status,
    stranded_memory,
)
from .check import Check

STUCK_READS: Final = 3
STUCK_READ_INTERVAL: Final = 0.1
"""Seconds between reads: a stuck state that lasts 0.2 s is not a page-in."""
QUEUE_PAIRS_PER_DEVICE: Final = 10
"""Thunderbolt RDMA devices take about ten queue pairs each (mlx PR 4209)."""
_DEFAULT_GRACE: Final = settings.Parsed(settings.DEFAULT_GRACE_SECONDS)
_DEFAULT_BUSY_WAIT: Final = settings.Parsed(settings.DEFAULT_BUSY_WAIT_SECONDS)


@final
@dataclass(frozen=True, slots=True)
class NodeFacts:
    toggle: settings.Parsed[bool]
    patch_status: patching.TreeStatus | None
    patch_error: str | None
    exo_tree: Path | None
    registry_path: Path
    registry_problem: str | None
    records: int
    registry_warnings: tuple[str, ...]
    verdicts: tuple[Verdict, ...]
    runners: tuple[ProcessInfo, ...]
    """Live exo runners on this node (spawn children running exo), orphans included."""
    stuck: tuple[tuple[int, str], ...]
    """(pid, state) of runners or orphans stuck in uninterruptible wait, and of this
    user's processes listed with their details vanished (exiting or stuck: `?`)."""
    guardian: service_status.GuardianFacts
    wired: WiredMemory | str | None = None
    """macOS's wired memory beside live footprints; a string: why it could not be
    read; None: not macOS."""
    rdma: rdma_ports.RdmaReport = rdma_ports.NOT_ON_PATH
    endings: tuple[Ending, ...] = ()
    """How runners ended since boot (`records.endings`)."""
    grace: settings.Parsed[float] = _DEFAULT_GRACE
    busy_wait: settings.Parsed[float] = _DEFAULT_BUSY_WAIT
    other_settings: tuple[str, ...] = ()
    """Warnings about the other settings (strategy, backend, scan interval): the value
    that was not taken, and what is used instead."""


def lasting_stuck_state(
    pid: int,
    read: Callable[[int], str | None] = system.stuck_state,
    pause: Callable[[float], None] = time.sleep,
) -> str | None:
    """The stuck state `pid` shows in every one of a few reads, else None.

    Any process passes through D for a moment while it pages in or writes: a loaded
    machine showed a just-started sleeper in D. Only a state that lasts is worth the
    reboot advice.
    """
    state = read(pid)
    for _ in range(STUCK_READS - 1):
        if state is None:
            return None
        pause(STUCK_READ_INTERVAL)
        if read(pid) != state:
            return None
    return state


def gather(exo_tree: Path | None) -> NodeFacts:
    patch_status: patching.TreeStatus | None = None
    patch_error: str | None = None
    if exo_tree is not None:
        try:
            patch_status = patching.check(exo_tree)
        except patching.PatchError as error:
            patch_error = str(error)
    path = settings.registry_dir()
    registry, problem = Registry.open(path, create=False)
    warnings: list[str] = []
    table, verdicts = judge(registry, SweepOptions(), warnings)
    records = len({verdict.record.path for verdict in verdicts if verdict.record is not None})
    runners = exo_runners(table, verdicts)
    suspects = {verdict.pid for verdict in verdicts if verdict.action == "kill"}
    exiting = {
        verdict.pid
        for verdict in verdicts
        if verdict.action == "spare" and verdict.process is not None and verdict.process.vanished
    }
    stuck = tuple(
        (pid, state)
        for pid in sorted(suspects | exiting | {runner.pid for runner in runners})
        if (state := lasting_stuck_state(pid) or ("?" if pid in exiting else None)) is not None
    )
    seen = (
        ()
        if registry is None
        else tuple(endings.read(registry.path / endings.ENDINGS_NAME, table.boot_id))
    )
    manager = service_files.manager_for(sys.platform)
    installed = service_status.installed_here(manager, Path.home(), os.environ)
    guardian = service_status.read(
        manager,
        installed,
        None if registry is None else registry.path,
        table.boot_id,
        seen,
        registry_problem=problem,
        linger=_linger(manager, installed),
    )
    return NodeFacts(
        toggle=settings.guard_enabled(),
        patch_status=patch_status,
        patch_error=patch_error,
        exo_tree=exo_tree,
        registry_path=path,
        registry_problem=problem,
        records=records,
        registry_warnings=tuple(warnings),
        verdicts=verdicts,
        runners=runners,
        stuck=stuck,
        guardian=guardian,
        wired=stranded_memory.measure(),
        rdma=rdma_ports.read_devinfo(),
        endings=seen,
        grace=settings.grace_setting(),
        busy_wait=settings.busy_wait_setting(),
        other_settings=bounds_check.other_setting_warnings(os.environ),
    )


def _linger(manager: service_files.Manager | None, installed: Path | None) -> bool | None:
    """Asked only of an installed systemd unit: only it stops at the last logout."""
    if manager != "systemd" or installed is None:
        return None
    return service_control.lingering(os.getuid(), service_control.run_command, shutil.which)


def exo_runners(table: ProcessTable, verdicts: Sequence[Verdict]) -> tuple[ProcessInfo, ...]:
    """Live spawn children known to be exo's runners: they show exo themselves, their
    parent does, or the guardian saw them under an exo (a verdict names them)."""
    named = {verdict.pid for verdict in verdicts if verdict.rule == "fingerprint"}

    def known(info: ProcessInfo) -> bool:
        parent = table.processes.get(Pid(info.ppid))
        return info.runs_exo or info.pid in named or (parent is not None and parent.runs_exo)

    return tuple(
        info
        for info in table.processes.values()
        if info.is_spawn_child and not info.exited and known(info)
    )


def assess(facts: NodeFacts) -> list[Check]:
    return [
        _guard(facts),
        service_status.check(facts.guardian),
        bounds_check.settings_check(facts.grace, facts.busy_wait, facts.other_settings),
        _patch(facts),
        _orphans(facts),
        _not_known(facts),
        _unkillable(facts),
        hard_kills.check(facts.endings),
        bounds_check.under_way_check(facts.endings),
        _registry(facts),
        _queue_pairs(facts),
        stranded_memory.check(facts.wired),
        rdma_ports.check(facts.rdma),
    ]


def _guard(facts: NodeFacts) -> Check:
    """The toggle turns on what runs inside a patched exo (its runners' hand-over of
    their own Shutdown, its start-up sweep); the guardian needs none. Off is only worth
    a warning where it turns something off: a patched exo named with --exo, or runners
    this environment's exo records."""
    if facts.toggle.warning is not None:
        return Check("guard", "WARN", facts.toggle.warning, f"set {settings.TOGGLE_ENV}=1")
    guarded = sum(
        1 for verdict in facts.verdicts if verdict.record is not None and verdict.action != "forget"
    )
    if facts.toggle.value:
        return Check(
            "guard",
            "OK",
            f"{settings.TOGGLE_ENV} is on here (the hooks inside a patched exo); "
            f"{guarded} guarded runner(s) recorded",
        )
    patched = facts.patch_status is not None and facts.patch_status.state == "applied"
    if patched:
        return Check(
            "guard",
            "WARN",
            f"exo at {facts.exo_tree} is patched, but {settings.TOGGLE_ENV} is off in this "
            "environment: its hooks do nothing",
            f"start that exo with {settings.TOGGLE_ENV}=true",
        )
    detail = (
        f"{settings.TOGGLE_ENV} is off here: it turns on only the hooks inside a patched "
        "exo; the guardian needs no toggle"
    )
    if guarded:
        detail += f"; {guarded} runner(s) are guarded (their exo has it on)"
    return Check("guard", "OK", detail)


def _patch(facts: NodeFacts) -> Check:
    if facts.exo_tree is None:
        return Check("exo patch", "SKIP", "no exo checkout given", "doctor --exo PATH")
    if facts.patch_error is not None:
        return Check("exo patch", "FAIL", facts.patch_error)
    assert facts.patch_status is not None
    series = facts.patch_status.series.name
    if facts.patch_status.state == "applied":
        return Check("exo patch", "OK", f"series {series} applied to {facts.exo_tree}")
    return Check(
        "exo patch",
        "WARN",
        f"series {series} fits {facts.exo_tree} but is not applied",
        f"exo-orphan-guard patch apply --exo {facts.exo_tree}",
    )


def _orphans(facts: NodeFacts) -> Check:
    orphans = [verdict for verdict in facts.verdicts if verdict.action == "kill"]
    if not orphans:
        return Check("orphans", "OK", "no leftover runners of dead workers")
    pids = ", ".join(str(verdict.pid) for verdict in orphans)
    return Check(
        "orphans",
        "FAIL",
        f"{len(orphans)} leftover runner(s) ({pids}) holding {_memory_held(orphans)}",
        "exo-orphan-guard sweep",
    )


def _not_known(facts: NodeFacts) -> Check:
    unknown = [verdict for verdict in facts.verdicts if verdict.not_known_exo]
    if not unknown:
        return Check("not known", "OK", "no orphan from exo's environment left unexplained")
    pids = ", ".join(str(verdict.pid) for verdict in unknown)
    return Check(
        "not known",
        "WARN",
        f"{len(unknown)} spawn child(ren) of a dead parent from exo's environment ({pids}), "
        f"orphaned, not known to be exo (nothing shows it), holding {_memory_held(unknown)}: "
        "never ended without --match",
        "exo-orphan-guard scan lists them; if they are exo's runners: "
        "exo-orphan-guard sweep --match REGEX (their command line)",
        {"pids": [verdict.pid for verdict in unknown]},
    )


def _memory_held(orphans: Sequence[Verdict]) -> str:
    """Summed and labelled: macOS footprints (Metal included) or RSS."""
    kinds: set[str] = set()
    total = 0
    for verdict in orphans:
        process = verdict.process
        if process is None:
            continue
        if process.memory is not None:
            kinds.add(process.memory.kind)
            total += process.memory.bytes
        elif process.rss is not None:
            kinds.add("rss")
            total += process.rss
    label = {"footprint": "physical footprint", "rss": "RSS"}
    described = " + ".join(label.get(kind, kind) for kind in sorted(kinds)) or "memory"
    return f"{total / 2**30:.1f} GiB ({described})"


def _unkillable(facts: NodeFacts) -> Check:
    unknown = [pid for pid, state in facts.stuck if state == "?"]
    known = [(pid, state) for pid, state in facts.stuck if state != "?"]
    if not known and unknown:
        return Check(
            "unkillable",
            "WARN",
            f"stuck or exiting, state unknown (ps shows ?): {', '.join(map(str, unknown))}",
            "run `sudo ps -o stat= -p PID` again in a minute: if it still shows U, or ?E, "
            "it is stuck in the kernel and only a reboot frees its memory",
        )
    if not known:
        return Check("unkillable", "OK", "no runner stuck in uninterruptible wait (D/U)")
    stuck = ", ".join(f"{pid} ({state})" for pid, state in known)
    if unknown:
        stuck += f"; state unknown: {', '.join(map(str, unknown))}"
    return Check(
        "unkillable",
        "FAIL",
        f"stuck in the kernel, SIGKILL cannot end them: {stuck}",
        "reboot this node: nothing else frees their RDMA resources",
    )


def _registry(facts: NodeFacts) -> Check:
    if facts.registry_problem is not None:
        return Check(
            "registry",
            "FAIL",
            facts.registry_problem,
            f"fix its owner/mode, or set {settings.DIR_ENV}",
        )
    stale = sum(1 for verdict in facts.verdicts if verdict.action == "forget")
    if facts.registry_warnings:
        return Check(
            "registry",
            "WARN",
            f"{len(facts.registry_warnings)} unusable file(s) in {facts.registry_path}: "
            + facts.registry_warnings[0],
            "delete the files named; they are ignored meanwhile",
        )
    detail = f"{facts.registry_path}: {facts.records} record(s), {stale} stale"
    former = settings.registry_dirs()[1:]
    if any(path.is_dir() for path in former):
        detail += f" (sweeps also read {former[0]}, from before EXO_HOME counted)"
    return Check(
        "registry", "OK", detail, "exo-orphan-guard sweep (removes stale ones)" if stale else None
    )


def _queue_pairs(facts: NodeFacts) -> Check:
    live = len(facts.runners)
    orphans = sum(
        1
        for verdict in facts.verdicts
        if verdict.action == "kill"
        and verdict.process is not None
        and verdict.process.is_spawn_child
    )
    detail = (
        f"{live} exo runner(s) alive here ({orphans} orphaned); each holds one queue pair per "
        f"peer per RDMA device, and a Thunderbolt device takes about {QUEUE_PAIRS_PER_DEVICE}"
    )
    if orphans:
        return Check("queue pairs", "WARN", detail, "exo-orphan-guard sweep (frees theirs)")
    if live > QUEUE_PAIRS_PER_DEVICE:
        return Check("queue pairs", "WARN", detail, "run fewer instances on this node")
    return Check("queue pairs", "OK", detail)


def render(checks: Sequence[Check]) -> str:
    system_name = f"{platform.system()} {platform.release()}"
    header = (
        f"exo-orphan-guard doctor: {platform.node()} "
        f"({system_name}, uid {os.geteuid()}, {system.BACKEND} backend)"
    )
    lines = [header]
    for check in checks:
        line = f"{check.status:<5} {check.name:<12} {check.detail}"
        if check.next_step is not None:
            line += f"\n{'':18}-> {check.next_step}"
        lines.append(line)
    return "\n".join(lines)


def to_json(checks: Sequence[Check]) -> str:
    return json.dumps(
        {
            "schema": "exo-orphan-guard/doctor/1",
            "backend": system.BACKEND,
            "checks": [
                {
                    "name": c.name,
                    "status": c.status,
                    "detail": c.detail,
                    "next": c.next_step,
                    **({"figures": dict(c.figures)} if c.figures else {}),
                }
                for c in checks
            ],
        },
        indent=2,
    )


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(check.status == "FAIL" for check in checks) else 0
