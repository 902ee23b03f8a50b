"""A copy of exo with the guard's present footprint in it, placed by text.

The footprint: `src/exo/worker/orphan_guard.py` (and its test) from
`exo_orphan_guard/exo/exo_tree`, two lines first in `bootstrap.entrypoint` and two
right after `logger.info("Starting Worker")` in `Worker.run`. Until `patch apply`
places exactly these, the tests that need them make their tree here.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.helpers.exo_trees import COMMITS, REPO, exo_src

EXO_TREE = REPO / "exo_orphan_guard" / "exo" / "exo_tree"
RUNNER_HUNK = (
    "    from exo.worker.orphan_guard import guard_runner\n",
    "\n",
    "    guard_runner(bound_instance, task_receiver)\n",
    "\n",
)
WORKER_HUNK = (
    "\n",
    "        from exo.worker.orphan_guard import guard_worker\n",
    "\n",
    "        guard_worker()\n",
)


def footprint_tree(work: Path, version: str) -> Path:
    """exo at `version` (a key of COMMITS) with the footprint, made once under `work`."""
    target = work / f"{version}-footprint"
    if target.exists():
        return target
    source = exo_src()
    partial = work / f"{version}-footprint.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(source), "archive", COMMITS[version]], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(partial)], input=archive.stdout, check=True)
    shutil.copytree(EXO_TREE, partial, dirs_exist_ok=True)
    _insert(partial / "src/exo/worker/runner/bootstrap.py", _after_entrypoint, RUNNER_HUNK)
    _insert(partial / "src/exo/worker/main.py", _after_starting_worker, WORKER_HUNK)
    partial.rename(target)
    return target


def _after_entrypoint(lines: list[str]) -> int:
    start = next(i for i, line in enumerate(lines) if line.startswith("def entrypoint("))
    return next(i for i in range(start, len(lines)) if lines[i].startswith(") -> None:")) + 1


def _after_starting_worker(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if 'logger.info("Starting Worker")' in line) + 1


def _insert(path: Path, where: Callable[[list[str]], int], hunk: tuple[str, ...]) -> None:
    lines = path.read_text().splitlines(keepends=True)
    at = where(lines)
    lines[at:at] = hunk
    path.write_text("".join(lines))
