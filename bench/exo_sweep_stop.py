"""Ctrl-C while exo's start-up sweep waits (issue 41 item 5): exo ends as fast as
with the guard off.

    python -m bench.exo_sweep_stop --rounds 10 [--versions main,v1.0.71]

Needs EXO_SRC and MLX_LM_SRC (as `make test-exo`), inside `scripts/confined`. Each
round starts `tests/exo_support/sweep_stop_node.py` in exo's venv, on the tree with
the PR in (nothing of this package importable): exo's real Worker under exo's own
SIGINT handling, after a dead exo left a recorded runner that takes SIGINT without
ending, so that the guarded sweep waits its whole bound for it. Once the sweep waits
(guard on) or exo first plans (guard off), one SIGINT to exo's process; seconds run
from it until exo's process has exited. Rounds alternate the guard off and on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .stats import Samples

VERSIONS = ("main", "v1.0.71")


def one(tree: Path, venv: Path, guard: bool) -> dict[str, Any]:
    from exo_orphan_guard.system.identity import identity_of
    from tests.helpers.exo_trees import SUPPORT, exo_environment
    from tests.helpers.processes import kill_all

    scratch = Path(tempfile.mkdtemp(prefix="eog-sweep-stop-"))
    environment = exo_environment(scratch, guard=guard)
    environment.pop("PYTHONPATH", None)  # nothing of this checkout in exo
    environment["EXO_HOME"] = str(scratch / "exo-home")
    node = subprocess.Popen(
        [
            str(venv / "bin" / "python"),
            str(SUPPORT / "sweep_stop_node.py"),
            "--scratch",
            str(scratch),
        ],
        cwd=tree,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    leftover = None
    try:
        assert node.stdout is not None
        ready, _, _ = select.select([node.stdout], [], [], 120)
        line: dict[str, Any] = json.loads(node.stdout.readline() if ready else b"{}")
        assert line.get("event") == "ready", line
        leftover = identity_of(int(line["leftover"]))
        sent = time.monotonic()
        node.send_signal(signal.SIGINT)
        code = node.wait(60)
        seconds = time.monotonic() - sent
        still = leftover is not None and identity_of(leftover.pid) == leftover
        return {"guard": guard, "exit": code, "seconds": seconds, "leftover_alive": still}
    finally:
        with contextlib.suppress(ProcessLookupError):
            node.kill()
        node.wait()
        if leftover is not None:
            kill_all([leftover])
        shutil.rmtree(scratch, ignore_errors=True)


def run(rounds: int, versions: list[str]) -> list[dict[str, Any]]:
    from tests.helpers.exo_trees import exo_tree, exo_venv, venv_cache

    for name in ("EXO_SRC", "MLX_LM_SRC"):
        if not os.environ.get(name):
            sys.exit(f"bench.exo_sweep_stop: {name} is not set (as for `make test-exo`)")
    work = Path(tempfile.mkdtemp(prefix="eog-sweep-stop-trees-"))
    done: list[dict[str, Any]] = []
    try:
        for version in versions:
            tree = exo_tree(work, version, patched=True, variant="bare")
            venv = exo_venv(tree, venv_cache(), runner=True, package=False)
            for _ in range(rounds):
                for guard in (False, True):
                    result = {"version": version, **one(tree, venv, guard)}
                    print(json.dumps(result), flush=True)
                    done.append(result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done


def render(done: list[dict[str, Any]]) -> str:
    out = [
        "| exo | guard | rounds | SIGINT to exo's exit p50 / p99 / max (s) | exit codes "
        "| leftover still there after exo's exit |",
        "|---|---|---|---|---|---|",
    ]
    for version in dict.fromkeys(line["version"] for line in done):
        for guard in (False, True):
            lines = [r for r in done if r["version"] == version and r["guard"] == guard]
            seconds = [float(r["seconds"]) for r in lines]
            samples = Samples([value * 1000 for value in seconds])
            quantiles = [samples.quantile(0.5), samples.quantile(0.99)]
            figures = " / ".join(
                [*(f"{(value or 0) / 1000:.2f}" for value in quantiles), f"{max(seconds):.2f}"]
            )
            codes = sorted({r["exit"] for r in lines})
            alive = sum(r["leftover_alive"] for r in lines)
            cells = [version, "on" if guard else "off", str(len(lines)), figures]
            out.append("| " + " | ".join([*cells, str(codes), f"{alive} of {len(lines)}"]) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.exo_sweep_stop")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--versions", default=",".join(VERSIONS))
    arguments = parser.parse_args()
    print(render(run(arguments.rounds, arguments.versions.split(","))))


if __name__ == "__main__":
    main()
