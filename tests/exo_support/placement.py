"""The new footprint's three hunks, placed in an exo tree by text at the anchors.

A stop-gap for the tests: `exo-orphan-guard patch apply` places the same hunks in
any exo tree once issue 28 item 3 lands; then `tests/helpers/exo_trees.py` should
call it instead, and this module should go. Until then the real-runner checks at
exo versions the stored series does not fit (v1.0.61, v1.0.65, v1.0.69) patch their
trees with `place_hooks`.

The hunks (issue 28 item 1): the hooks module `src/exo/worker/orphan_guard.py`
(its text is `exo_orphan_guard/exo/exo_tree/...`), two lines at the top of
`bootstrap.entrypoint` and two after `logger.info("Starting Worker")` in
`Worker.run`, each import next to its call the way exo's bootstrap imports its
runner. The anchors come from `exo_orphan_guard.exo.anchors` (ast), so the lines
land where they belong whatever the imports around them look like.
"""

from __future__ import annotations

from pathlib import Path

from exo_orphan_guard.exo import anchors

REPO = Path(__file__).resolve().parents[2]
HOOKS_FILE = "src/exo/worker/orphan_guard.py"
HOOKS_TEXT = REPO / "exo_orphan_guard" / "exo" / "exo_tree" / HOOKS_FILE
RUNNER_LINES = (
    "from exo.worker.orphan_guard import guard_runner",
    "",
    "guard_runner(bound_instance, task_receiver)",
)
WORKER_LINES = ("from exo.worker.orphan_guard import guard_worker", "", "guard_worker()")
"""Each with the blank line after the import that exo's `ruff format` asks for."""


class PlacementError(Exception):
    pass


def place_hooks(tree: Path) -> list[str]:
    """Put the three hunks into `tree`; the files changed, relative to it.

    Nothing is written unless every anchor is found and the tree has no hooks yet."""
    found = {anchor.anchor: anchor for anchor in anchors.find(tree)}
    entrypoint, worker_run = found["entrypoint"], found["Worker.run"]
    for anchor in (entrypoint, worker_run, found["Shutdown"]):
        if not isinstance(anchor, anchors.Found):
            raise PlacementError(anchor.describe())
    assert isinstance(entrypoint, anchors.Found) and isinstance(worker_run, anchors.Found)
    if (tree / HOOKS_FILE).exists():
        raise PlacementError(f"{tree / HOOKS_FILE} exists: the hooks are in already")
    first = entrypoint.body_line
    bootstrap = _insert(tree / entrypoint.file, first, entrypoint.indent, RUNNER_LINES)
    if bootstrap[first - 1 + len(RUNNER_LINES)].lstrip().startswith(('"', "'")):
        raise PlacementError(f"{entrypoint.file}: entrypoint has a docstring; not handled")
    after = worker_run.body_line + 1  # after `logger.info("Starting Worker")`, one line
    worker = _insert(tree / worker_run.file, after, worker_run.indent, WORKER_LINES)
    (tree / entrypoint.file).write_text("".join(bootstrap), encoding="utf-8")
    (tree / worker_run.file).write_text("".join(worker), encoding="utf-8")
    (tree / HOOKS_FILE).write_bytes(HOOKS_TEXT.read_bytes())
    return [HOOKS_FILE, entrypoint.file, worker_run.file]


def _insert(path: Path, line: int, indent: str, lines: tuple[str, ...]) -> list[str]:
    """`path`'s lines with `lines` (indented) before its 1-based line `line`."""
    text = path.read_text(encoding="utf-8").splitlines(keepends=True)
    added = [f"{indent}{one}\n" if one else "\n" for one in lines]
    return [*text[: line - 1], *added, *text[line - 1 :]]
