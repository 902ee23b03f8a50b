"""The tables of docs/exo.md ("EXO.app's quit", "Ctrl-C and process groups") from the
JSON lines `python -m tests.helpers.app_quit --out FILE` writes; `--table FILE`
prints them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.app_quit import Round

BUSY_LABELS = {
    "eval": "in one long `mx.eval`",
    "decode": "in exo's decode loop",
    "gil": "wedged (SIGTERM ignored, GIL held)",
}


def table(path: Path) -> str:
    """The markdown table of a `--out` file: one row per version, scenario, guard."""
    rows: dict[tuple[str, str, str, bool], list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        done = json.loads(line)
        key = (
            done["version"],
            done["scenario"],
            done["busy"],
            done["guard"],
        )
        rows.setdefault(key, []).append(done)
    out = [
        "| exo | stopped by | busy runner | guard | rounds | exo's process ended | signals sent "
        "| idle runner ended | busy runner ended | runners' KeyboardInterrupt tracebacks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (version, scenario, busy, guard), rounds in rows.items():
        cells = [
            version,
            "the app (SIGINT, 5 s, SIGTERM, 3 s, SIGKILL)"
            if scenario == "app"
            else "Ctrl-C (SIGINT to the group)",
            BUSY_LABELS.get(busy, busy),
            "on" if guard else "off",
            str(len(rounds)),
            _span([r["exo_end_s"] for r in rounds])
            + " "
            + _kinds([f"exit {r['exo_exit']}" for r in rounds]),
            _kinds([" ".join(name for name, _ in r["signals"]) for r in rounds]),
        ]
        for role in ("idle", "busy"):
            ends = [r["runners"][role] for r in rounds]
            cells.append(_span([e["gone_s"] for e in ends]) + " " + _kinds([_how(e) for e in ends]))
        cells.append(_kinds([str(r.get("keyboard_interrupts", "not counted")) for r in rounds]))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _span(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    parts: list[str] = []
    if known:
        low, high = min(known), max(known)
        parts.append(f"{low:.2f} s" if low == high else f"{low:.2f}\N{EN DASH}{high:.2f} s")
    if len(known) < len(values):
        parts.append(f"alive at the end ({len(values) - len(known)} of {len(values)})")
    return ", ".join(parts)


def _kinds(values: list[str]) -> str:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{value} \N{MULTIPLICATION SIGN}{n}" for value, n in counts.items())


def _how(end: dict[str, Any]) -> str:
    match end["by"]:
        case "exo":
            return f"by exo: {end['how']}"
        case "guard":
            return f"by the guard: {end['how']}"
        case other:
            return other


def record(done: Round) -> dict[str, Any]:
    return {
        "version": done.version,
        "guard": done.guard,
        "scenario": done.scenario,
        "busy": done.busy,
        "keyboard_interrupts": done.keyboard_interrupts,
        "exo_end_s": done.exo_end_s,
        "exo_exit": done.exo_exit,
        "signals": done.signals,
        "runners": {role: vars(end) for role, end in done.runners.items()},
        "events": [e for e in done.events if e["event"] in ("shutdown", "exiting", "runner-ended")],
    }
