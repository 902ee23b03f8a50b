"""The reach table: how many of exo's trees `patch apply` reaches, and where the rest
stop. Pure: records in (`bench.reach`), Markdown out."""

from __future__ import annotations

import collections
import datetime
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .reach import Record

_FAILED_HUNK: Final = re.compile(r": (\S+), hunk (\d+) \(@@[^)]*\) of (\d{4})-")


REQUIRED: Final = ("entrypoint", "Worker.plan_step", "constants", "Shutdown")
"""The anchors every tree needs; `Runner.main` only picks where the runner's hook goes."""


def required(record: Record) -> list[dict[str, object]]:
    return [dict(anchor) for anchor in record["anchors"] if anchor["anchor"] in REQUIRED]


def anchors_found(record: Record) -> int:
    return sum(bool(anchor["found"]) for anchor in required(record))


def all_anchors(record: Record) -> bool:
    return anchors_found(record) == len(required(record))


def name(record: Record) -> str:
    return record["release"] or record["describe"]


def stopped_at(record: Record) -> str:
    """Where `patch apply` stopped: `file, patch NNNN hunk N`, or its first words."""
    if record["reached"]:
        return "reached"
    if record["apply_exit"] == 0:
        failed = [
            check
            for check, ok in (
                ("hooks", record["hooks"]),
                ("py_compile", record["compiles"]),
                ("ruff", record.get("ruff_clean") is not False),
                ("revert", record["revert_exact"]),
            )
            if not ok
        ]
        return f"applied, but {', '.join(failed)} failed"
    found = _FAILED_HUNK.search(record["apply_line"])
    if found is None:
        return record["apply_line"].removeprefix("exo-orphan-guard: error: ")[:80]
    path, hunk, patch = found.groups()
    return f"{path.rsplit('/', 1)[-1]}, patch {patch} hunk {hunk}"


def render(records: Sequence[Record], step: int, command: str, tip_name: str) -> str:
    releases = [record for record in records if record["release"]]
    line = [record for record in records if record["first_parent_index"] is not None]
    tip = max(line, key=lambda record: record["first_parent_index"] or 0) if line else None
    today = datetime.date.today().isoformat()
    rows = [
        _row(f"releases {_span(releases)}", releases),
        *([_row(f"{tip_name} ({tip['commit'][:12]})", [tip])] if tip is not None else []),
        _row(f"first-parent commits: {_every(step)}, the releases on it, {tip_name}", line),
        _row("all trees measured", records),
    ]
    reasons = collections.Counter(stopped_at(record) for record in records if not record["reached"])
    text = [
        f"`{command}` on {today}; series fingerprint "
        f"{records[0]['fingerprint'] if records else '-'}.",
        "",
        "| trees | measured | reached by `patch apply` (both series) | all four anchors found "
        "| runner's hook on its own task queue |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "| release | date | `patch apply` | anchors found |",
        "|---|---|---|---|",
        *(
            f"| {record['release']} | {record['date'][:10]} | {stopped_at(record)} | "
            f"{anchors_found(record)} of {len(required(record))} |"
            for record in releases
        ),
        "",
        "Where the trees not reached stop (the anchor missing, or the check that failed):",
        "",
        *(f"- {reason}: {count}" for reason, count in reasons.most_common()),
    ]
    missing = [
        f"- {name(record)}: {anchor['anchor']}: {anchor['where']}"
        for record in records
        for anchor in required(record)
        if not anchor["found"]
    ]
    if missing:
        text += ["", "Anchors missing:", "", *missing]
    return "\n".join(text) + "\n"


def _row(label: str, records: Sequence[Record]) -> str:
    count = len(records)
    reached = [record for record in records if record["reached"]]
    with_anchors = sum(all_anchors(record) for record in records)
    queued = sum(record.get("runner_hook") == "work queue" for record in reached)
    which = f": {', '.join(name(record) for record in reached)}" if 0 < len(reached) <= 4 else ""
    return (
        f"| {label} | {count} | {len(reached)} ({_share(len(reached), count)}){which} | "
        f"{with_anchors} ({_share(with_anchors, count)}) | {queued} of {len(reached)} |"
    )


def _every(step: int) -> str:
    return "every one" if step == 1 else f"every {step}th"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _span(releases: Sequence[Record]) -> str:
    tags = [record["release"] or "" for record in releases]
    return f"{tags[0]} to {tags[-1]}" if tags else "(none)"
