"""The tables of docs/exo-evidence.md ("exo's own stops, guarded and not", and the per-round
detail below it), and the rounds behind them (`tests/helpers/app_quit.py`):
`python -m tests.helpers.app_quit_table --rounds 3 --out FILE` plays them and keeps
JSON lines; `--table FILE` prints the tables from those."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.helpers.app_quit import CONFIG_LABELS, CONFIGS, Round, exo_for, run_round
from tests.helpers.exo_trees import exo_tree, exo_venv, venv_cache
from tests.helpers.runner_reading import unchanged

BUSY_LABELS = {
    "eval": "in one long `mx.eval`",
    "decode": "in exo's decode loop",
    "gil": "wedged (SIGTERM ignored, GIL held)",
}


_LABELS: dict[str, str] = {str(key): value for key, value in CONFIG_LABELS.items()}
SCENARIOS = {
    "ctrl-c": "Ctrl-C",
    "app": "the app's quit",
    "shutdown": "exo's `Shutdown`",
}


def table(path: Path) -> str:
    return side_by_side(path) + "\n\n" + detail(path)


def side_by_side(path: Path) -> str:
    """One row per version and configuration: the runners read from outside, as guard
    off's (same version), and how each of exo's stops ended them."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for done in records:
        rows.setdefault((done["version"], done["config"]), []).append(done)
    scenarios = [name for name in SCENARIOS if any(r["scenario"] == name for r in records)]
    out = [
        "| exo | configuration | package importable in exo | rounds | runners' signal "
        "handlers, masks, process group, session, children as guard off's | runner "
        "threads (idle, busy) | "
        + " | ".join(
            f"{SCENARIOS[name]}: idle runner | {SCENARIOS[name]}: busy runner" for name in scenarios
        )
        + " |",
        "|---|---|---|---|---|---|" + "---|---|" * len(scenarios),
    ]
    for (version, config), rounds in rows.items():
        baseline = next(
            (r for r in records if r["version"] == version and r["config"] == "off"), None
        )
        differ: set[str] = set()
        for done in rounds:
            for role, seen in done["observed"].items():
                if baseline is not None:
                    differ.update(unchanged(seen, baseline["observed"][role]))
        same = (
            "no baseline"
            if baseline is None
            else ("yes" if not differ else "no: " + ", ".join(sorted(differ)))
        )
        threads = _kinds(
            [
                f"{d['observed']['idle']['threads']}, {d['observed']['busy']['threads']}"
                for d in rounds
            ]
        )
        cells = [
            version,
            _LABELS.get(config, config),
            _kinds([str(d["package_seen"]).lower() for d in rounds]),
            _kinds([f"{sum(d['scenario'] == name for d in rounds)}" for name in scenarios])
            + " per stop",
            same,
            threads,
        ]
        for name in scenarios:
            these = [d for d in rounds if d["scenario"] == name]
            for role in ("idle", "busy"):
                ends = [d["runners"][role] for d in these]
                cells.append(
                    _kinds([_how(e) for e in ends]) + ", " + _span([e["gone_s"] for e in ends])
                )
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def detail(path: Path) -> str:
    """The markdown table of a `--out` file: one row per version, scenario, configuration."""
    rows: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        done = json.loads(line)
        key = (
            done["version"],
            done["scenario"],
            done["busy"],
            done["config"],
        )
        rows.setdefault(key, []).append(done)
    out = [
        "| exo | stopped by | busy runner | configuration | rounds | exo's process ended "
        "| signals sent | idle runner ended | busy runner ended | runners' KeyboardInterrupt "
        "tracebacks | guardians started |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    stopped_by = {
        "app": "the app (SIGINT, 5 s, SIGTERM, 3 s, SIGKILL)",
        "ctrl-c": "Ctrl-C (SIGINT to the group)",
        "shutdown": "exo's `Shutdown` (instance deleted)",
    }
    for (version, scenario, busy, config), rounds in rows.items():
        cells = [
            version,
            stopped_by.get(scenario, scenario),
            BUSY_LABELS.get(busy, busy),
            _LABELS.get(config, config),
            str(len(rounds)),
            (
                _span([r["exo_end_s"] for r in rounds])
                + " "
                + _kinds([f"exit {r['exo_exit']}" for r in rounds])
                if scenario != "shutdown"
                else "lives on"
            ),
            _kinds([" ".join(name for name, _ in r["signals"]) for r in rounds]),
        ]
        for role in ("idle", "busy"):
            ends = [r["runners"][role] for r in rounds]
            cells.append(_span([e["gone_s"] for e in ends]) + " " + _kinds([_how(e) for e in ends]))
        cells.append(_kinds([str(r.get("keyboard_interrupts", "not counted")) for r in rounds]))
        cells.append(
            _kinds([str(r.get("guardian_started", "not recorded")).lower() for r in rounds])
        )
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _span(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    parts: list[str] = []
    if known:
        low, high = min(known), max(known)
        low_s, high_s = f"{low:.2f}", f"{high:.2f}"
        parts.append(f"{low_s} s" if low_s == high_s else f"{low_s}\N{EN DASH}{high_s} s")
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
        case "guardian" | "sweep" | "watchdog" | "watch":
            return f"by the {end['by']}: {end['how']}"
        case other:
            return other


def record(done: Round) -> dict[str, Any]:
    return {
        "version": done.version,
        "config": done.config,
        "guard": done.guard,
        "package_seen": done.package_seen,
        "observed": done.observed,
        "guardians": done.guardians,
        "guardian_started": done.guardian_started,
        "left_behind": done.left_behind,
        "scenario": done.scenario,
        "busy": done.busy,
        "keyboard_interrupts": done.keyboard_interrupts,
        "exo_end_s": done.exo_end_s,
        "exo_exit": done.exo_exit,
        "signals": done.signals,
        "runners": {role: vars(end) for role, end in done.runners.items()},
        "events": [e for e in done.events if e["event"] in ("shutdown", "exiting", "runner-ended")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--versions", default="main,v1.0.71")
    parser.add_argument("--scenarios", default="ctrl-c,app,shutdown")
    parser.add_argument("--busy", default="eval")
    parser.add_argument("--eval-seconds", type=float, default=12.0)
    parser.add_argument("--busy-wait", type=float, default=None)
    parser.add_argument("--observe", type=float, default=40.0)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table", type=Path, default=None, help="the table of an --out file")
    args = parser.parse_args()
    if args.table is not None:
        print(table(args.table))
        return
    work = Path(tempfile.mkdtemp(prefix="eog-app-quit-trees-"))
    try:
        for version in args.versions.split(","):
            for scenario in args.scenarios.split(","):
                for config in args.configs.split(","):
                    tree, venv = exo_for(work, version, config, exo_tree, exo_venv, venv_cache())
                    for _ in range(args.rounds):
                        done = run_round(
                            tree,
                            venv,
                            version,
                            config=config,
                            scenario=scenario,
                            busy=args.busy,
                            eval_seconds=args.eval_seconds,
                            busy_wait=args.busy_wait,
                            observe=args.observe,
                        )
                        print(done.line(), flush=True)
                        if args.out is not None:
                            with args.out.open("a") as out:
                                out.write(json.dumps(record(done)) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
