"""Sweep reports for people (a table) and for programs (JSON, schema in the README)."""

from __future__ import annotations

import json
import shlex
import time
from typing import Final

from ..records.endings import Ending
from ..system.process_facts import MemoryUsage
from .engine import KillResult
from .process_table import ProcessInfo
from .sweep_report import SweepReport
from .verdicts import Verdict

REPORT_SCHEMA: Final = "exo-orphan-guard/sweep-report/1"
_COMMAND_WIDTH: Final = 60


def to_json(report: SweepReport, command: str) -> str:
    now = time.time()
    document = {
        "schema": REPORT_SCHEMA,
        "command": command,
        "dry_run": report.dry_run,
        "registry": None if report.registry is None else str(report.registry),
        "elapsed_s": round(report.elapsed_seconds, 4),
        "exit_code": report.exit_code,
        "summary": report.summary(),
        "suspects": [_suspect(verdict, now, report) for verdict in report.targets],
        "results": [_result(result) for result in report.results],
        "spared": [
            {
                "pid": verdict.pid,
                "reason": verdict.reason,
                "argv": _argv(verdict.process),
                "not_known_exo": verdict.not_known_exo,
            }
            for verdict in report.verdicts
            if verdict.action == "spare"
        ],
        "forgotten_records": [
            {"pid": verdict.pid, "reason": verdict.reason, "path": str(verdict.record.path)}
            for verdict in report.verdicts
            if verdict.action == "forget" and verdict.record is not None
        ],
        "other_users_spared": report.other_users_spared,
        "continued": [identity.pid for identity in report.continued],
        "warnings": list(report.warnings),
    }
    return json.dumps(document, indent=2)


def to_table(report: SweepReport, *, show_spared: bool = False) -> str:
    now = time.time()
    lines: list[str] = [f"warning: {warning}" for warning in report.warnings]
    targets = report.targets
    if targets:
        lines.append(
            f"{'PID':>7} {'PPID':>7} {'AGE':>8} {'MEMORY':>17} {'STATE':<9} {'RULE':<16} "
            "LABELS / COMMAND"
        )
        for verdict in targets:
            process = verdict.process
            lines.append(
                f"{verdict.pid:>7} {_text(process and process.ppid):>7} "
                f"{_age(process, now):>8} {_memory(process):>17} "
                f"{_text(process and process.status):<9} {verdict.rule or '':<16} "
                f"{_who(verdict)}"
            )
        for verdict in targets:
            if family := report.would_signal.get(verdict.pid):
                listed = " ".join(str(pid) for pid in family)
                lines.append(f"{verdict.pid}: with it, its descendant(s) {listed}")
            if (ending := _ending(verdict, report)) is not None:
                lines.append(f"{verdict.pid}: {_ending_text(ending)}")
    for identity in report.continued:
        lines.append(f"continued {identity.pid}: a dead sweep had left it stopped")
    for result in report.results:
        lines.append(_result_line(result))
    exiting = [verdict for verdict in report.verdicts if _exiting(verdict)]
    for verdict in exiting:
        lines.append(
            f"EXITING {verdict.pid} ({_who(verdict) or 'command line gone'}): {verdict.reason}"
        )
    unknown = [verdict for verdict in report.verdicts if verdict.not_known_exo]
    for verdict in unknown:
        lines.append(f"NOT KNOWN {verdict.pid} ({_who(verdict)}): {verdict.reason}")
    if show_spared:
        for verdict in report.verdicts:
            if verdict.action != "kill" and verdict not in exiting and verdict not in unknown:
                lines.append(f"{verdict.action}: {verdict.pid}: {verdict.reason}")
    lines.append(report.summary())
    return "\n".join(lines)


def _exiting(verdict: Verdict) -> bool:
    """Spared as exiting or stuck: shown without --all, since it may hold a model."""
    return verdict.action == "spare" and verdict.process is not None and verdict.process.vanished


def _result_line(result: KillResult) -> str:
    pid = result.target.pid
    family = f" and {len(result.descendants)} descendant(s)" if result.descendants else ""
    signals = ", ".join(result.signals) or "no signal needed"
    match result.outcome:
        case "killed":
            return f"ended {pid}{family} ({signals}): ended {result.ended} by {result.last_signal}"
        case "exited":
            return f"{pid} exited by itself{family}: ended {result.ended}"
        case "unkillable":
            state = f" in state {result.stuck_state}" if result.stuck_state else ""
            left = " ".join(str(left) for left in result.left)
            return f"UNKILLABLE {pid}{state} (still there: {left}): {result.advice}"


def _suspect(verdict: Verdict, now: float, report: SweepReport) -> dict[str, object]:
    process = verdict.process
    return {
        "pid": verdict.pid,
        "ppid": None if process is None else process.ppid,
        "uid": None if process is None else process.uid,
        "age_s": None if process is None else round(process.age_seconds(now), 1),
        "rss_bytes": None if process is None else process.rss,
        "memory": None if process is None else memory_json(process.memory),
        "state": None if process is None else process.status,
        "rule": verdict.rule,
        "reason": verdict.reason,
        "labels": dict(verdict.labels),
        "exe": None if process is None else process.exe,
        "argv": _argv(process),
        "descendants": list(report.would_signal.get(verdict.pid, ())),
        "ending": _ending_json(_ending(verdict, report)),
    }


def _result(result: KillResult) -> dict[str, object]:
    return {
        "pid": result.target.pid,
        "outcome": result.outcome,
        "signals": list(result.signals),
        "descendants": list(result.descendants),
        "stuck_state": result.stuck_state,
        "left": list(result.left),
        "advice": result.advice,
        "ended": result.ended,
        "signal": result.last_signal,
    }


def _ending(verdict: Verdict, report: SweepReport) -> Ending | None:
    return None if verdict.process is None else report.target_endings.get(verdict.process.identity)


def _ending_json(ending: Ending | None) -> dict[str, object] | None:
    if ending is None:
        return None
    left = None if ending.deadline is None else max(0.0, ending.deadline - time.monotonic())
    document: dict[str, object] = {
        "event": ending.event,
        "how": ending.how,
        "why": ending.why,
        "grace_left_s": None if left is None or ending.event == "busy" else round(left, 2),
    }
    if ending.event == "busy":
        document["gil"] = ending.gil
        document["busy_s"] = round(max(0.0, time.time() - ending.at), 1)
        document["busy_wait_s"] = ending.busy_wait
        document["left_s"] = None if left is None else round(left, 2)
    return document


def _ending_text(ending: Ending) -> str:
    if ending.event == "busy":
        since = max(0.0, time.time() - ending.at)
        bound = "" if ending.busy_wait is None else f"; killed at {ending.busy_wait:g} s"
        return (
            f"ending: busy in native code {since:.0f} s, GIL {ending.gil or 'held or free'}"
            f"{bound} unless it returns"
        )
    if ending.event == "begun" and ending.deadline is not None:
        left = max(0.0, ending.deadline - time.monotonic())
        return f"ending the clean way ({ending.why}), {left:.1f} s of its grace left"
    return f"ended: {ending.how} ({ending.why})"


def _argv(process: ProcessInfo | None) -> list[str]:
    return [] if process is None else list(process.argv)


def _who(verdict: Verdict) -> str:
    labels = " ".join(f"{key}={value}" for key, value in sorted(verdict.labels.items()))
    command = shlex.join(_argv(verdict.process))
    if len(command) > _COMMAND_WIDTH:
        command = command[: _COMMAND_WIDTH - 3] + "..."
    return f"{labels} {command}".strip()


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _age(process: ProcessInfo | None, now: float) -> str:
    if process is None:
        return "-"
    seconds = int(process.age_seconds(now))
    if seconds < 120:
        return f"{seconds}s"
    minutes, _ = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


def memory_json(memory: MemoryUsage | None) -> dict[str, object] | None:
    """`kind` says what `bytes` is: "footprint" (macOS) or "rss"."""
    return None if memory is None else {"kind": memory.kind, "bytes": memory.bytes}


def _memory(process: ProcessInfo | None) -> str:
    """Labelled: a footprint (what Activity Monitor shows) is not an RSS."""
    if process is None:
        return "-"
    if process.memory is not None:
        return f"{_size(process.memory.bytes)} {process.memory.kind}"
    return "-" if process.rss is None else f"{_size(process.rss)} rss"


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
