"""exo's own stop, pristine against the bugfix series, at main and v1.0.71.

    python -m bench.exo_stop --rounds 5 [--versions v1.0.71,main] [--out FILE]
    python -m bench.exo_stop --table FILE          # the table of an --out file
    python -m bench.run_all --only exo-stop --exo-stop-rounds 5   (opt-in section)

Needs EXO_SRC and MLX_LM_SRC (as `make test-exo`), inside `scripts/confined`. Each
round is `tests/helpers/exo_stop.py`'s: exo's real Worker and RunnerSupervisors (from
the pristine tree, or the same with `patches/bugfix/<version>/` applied) with an idle
runner and one in a long `mx.eval`; one SIGINT to exo's process (exo's handler calls its
own `shutdown()`); each runner watched until it is gone. Rounds interleave the four
trees. How a runner ended is what exo's process saw when it reaped it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .stats import Samples

VERSIONS = ("v1.0.71", "main")

DESCRIPTION = (
    "exo's real Worker and RunnerSupervisors (the trees as they are, or with "
    "`patches/bugfix/<version>/` applied), an idle runner and one inside a "
    "12 s `mx.eval`; one SIGINT to exo's process, which exo's handler turns into its "
    "own `shutdown()` (`tests/helpers/exo_stop.py`). Seconds run from the SIGINT until "
    "the runner is gone (reaped by exo's process, or its pid gone); how it ended is "
    "what exo's process saw when it reaped it. Rounds interleave the four trees."
)


def run(rounds: int, versions: list[str], out: Path | None) -> list[dict[str, Any]]:
    from tests.helpers.app_quit_table import record
    from tests.helpers.exo_stop import stop_round
    from tests.helpers.exo_trees import venv_cache

    for name in ("EXO_SRC", "MLX_LM_SRC"):
        if not os.environ.get(name):
            sys.exit(f"bench.exo_stop: {name} is not set (as for `make test-exo`)")
    work = Path(tempfile.mkdtemp(prefix="eog-exo-stop-trees-"))
    done: list[dict[str, Any]] = []
    try:
        for _ in range(rounds):
            for version in versions:
                for fixed in (False, True):
                    result = stop_round(version, fixed=fixed, work=work, venv_cache=venv_cache())
                    line = {**record(result), "bugfix": fixed}
                    print(f"{'bugfix' if fixed else 'pristine'} {result.line()}", flush=True)
                    done.append(line)
                    if out is not None:
                        with out.open("a") as file:
                            file.write(json.dumps(line) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done


def render(done: list[dict[str, Any]]) -> str:
    groups: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for line in done:
        groups.setdefault((line["version"], line["bugfix"]), []).append(line)
    out = [
        "| exo | tree | rounds | idle runner ended | idle gone p50 / p99 (s) "
        "| busy runner ended | busy gone p50 / p99 (s) | exo's process ended p50 / p99 (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (version, fixed), lines in sorted(groups.items(), key=lambda item: item[0]):
        cells = [version, "bugfix" if fixed else "pristine", str(len(lines))]
        for role in ("idle", "busy"):
            ends = [line["runners"][role] for line in lines]
            cells.append(_kinds([end["how"] for end in ends]))
            cells.append(_quantiles([end["gone_s"] for end in ends]))
        exits = _kinds([f"exit {line['exo_exit']}" for line in lines])
        cells.append(f"{_quantiles([line['exo_end_s'] for line in lines])} ({exits})")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _quantiles(values: list[float | None]) -> str:
    samples = Samples([None if v is None else v * 1000 for v in values])
    p50, p99 = samples.quantile(0.5), samples.quantile(0.99)
    return " / ".join("alive" if v is None else f"{v / 1000:.2f}" for v in (p50, p99))


def _kinds(values: list[str]) -> str:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return ", ".join(f"{value} ({count} of {len(values)})" for value, count in counts.items())


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.exo_stop")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--out", type=Path, default=None, help="append each round as JSON")
    parser.add_argument("--table", type=Path, default=None, help="the table of an --out file")
    arguments = parser.parse_args()
    if arguments.table is not None:
        print(render(load(arguments.table)))
        return
    done = run(arguments.rounds, arguments.versions.split(","), arguments.out)
    print(render(done))


if __name__ == "__main__":
    main()
