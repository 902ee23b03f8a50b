"""exo's real runner, idle, whose worker is SIGKILLed, with the PR's parent watch and
nothing of this package in exo's environment (issue 41's cover-letter figures).

    python -m bench.exo_parent_watch --rounds 5 [--versions main,v1.0.71]

Needs EXO_SRC and MLX_LM_SRC (as `make test-exo`), inside `scripts/confined`. Each
round: exo's real RunnerSupervisor spawns exo's real entrypoint
(`tests/exo_support/worker_harness.py`) in the tree with the PR in; once the runner
is idle, SIGKILL of the worker's pid alone; seconds until the runner is gone (it
ended itself through exo's own Runner.shutdown; with the guard off it stays).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .stats import Samples

VERSIONS = ("main", "v1.0.71")


def run(rounds: int, versions: list[str]) -> list[dict[str, Any]]:
    from exo_orphan_guard.rig.scenarios import wait_gone
    from exo_orphan_guard.system.identity import identity_of
    from tests.helpers.exo_trees import exo_tree, exo_venv, exo_worker, venv_cache

    for name in ("EXO_SRC", "MLX_LM_SRC"):
        if not os.environ.get(name):
            sys.exit(f"bench.exo_parent_watch: {name} is not set (as for `make test-exo`)")
    work = Path(tempfile.mkdtemp(prefix="eog-parent-watch-trees-"))
    done: list[dict[str, Any]] = []
    for version in versions:
        tree = exo_tree(work, version, patched=True, variant="bare")
        venv = exo_venv(tree, venv_cache(), runner=True, package=False)
        for _ in range(rounds):
            for guard in (True, False):
                with exo_worker(tree, venv, version, guard=guard, package=False) as report:
                    runner = identity_of(report["runner_pid"])
                    assert runner is not None
                    os.kill(report["worker_pid"], signal.SIGKILL)
                    killed = time.monotonic()
                    gone = wait_gone([runner], 10.0)[runner]
                seconds = None if gone is None else gone - killed
                line = {"version": version, "guard": guard, "gone_s": seconds}
                print(json.dumps(line), flush=True)
                done.append(line)
    return done


def render(done: list[dict[str, Any]]) -> str:
    out = [
        "| exo | guard | rounds | runner gone after its worker's SIGKILL, p50 / max (s) |",
        "|---|---|---|---|",
    ]
    for version in dict.fromkeys(line["version"] for line in done):
        for guard in (True, False):
            lines = [r for r in done if r["version"] == version and r["guard"] == guard]
            values = [r["gone_s"] for r in lines]
            if any(value is None for value in values):
                alive = sum(value is None for value in values)
                cell = f"alive 10 s later in {alive} of {len(values)}"
            else:
                samples = Samples([value * 1000 for value in values])
                cell = f"{(samples.quantile(0.5) or 0) / 1000:.2f} / {max(values):.2f}"
            out.append(f"| {version} | {'on' if guard else 'off'} | {len(lines)} | {cell} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.exo_parent_watch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--versions", default=",".join(VERSIONS))
    arguments = parser.parse_args()
    print(render(run(arguments.rounds, arguments.versions.split(","))))


if __name__ == "__main__":
    main()
