"""What each series adds to exo: the files, the hooks and the settings (`placement`
puts them into a tree).

- The PR (`exo_tree/`): exo's own guard, exo's code only, in one of two shapes by
  exo's runner. `WORK_QUEUE` where the runner feeds its own in-process task queue
  (exo #1993: main, and the trees since v1.0.71-7): the runner's hook goes first in
  `Runner.main` and hands Shutdown on that queue. `RELAY` elsewhere (every release up
  to v1.0.71): first in `entrypoint`'s `try`, it gives the runner a task stream of its
  own. The worker's hook goes first in `Worker.plan_step`; the settings at the end of
  `shared/constants.py`.
- `WITH_PACKAGE` (`exo_tree_with_package/`): this project's part inside exo, on top
  of the PR, never sent upstream: one module and its call first in
  `Worker.plan_step`, before the PR's.

Each hook is four lines: `from exo.x import y`, a blank line, the call, a blank line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from . import anchors

HERE: Final = Path(__file__).resolve().parent
EXO_TREE: Final = HERE / "exo_tree"
"""The PR's files, at their paths relative to this directory."""
EXO_TREE_WITH_PACKAGE: Final = HERE / "exo_tree_with_package"
"""The local series' files, likewise."""
TOGGLE: Final = "EXO_ORPHAN_GUARD"
TOGGLE_LINE: Final = f'{TOGGLE} = os.getenv("{TOGGLE}", "false").lower() in ("true", "1")'
SETTINGS: Final = (
    f"# With {TOGGLE} on, a runner whose worker dies takes exo's own Shutdown, and the",
    "# worker's start-up sweep ends the recorded runners a dead exo left behind.",
    '# "true" as exo\'s other toggles, or "1"',
    TOGGLE_LINE,
    'EXO_RUNNER_RECORDS_DIR = EXO_CACHE_HOME / "runners"',
    "# The start-up sweep's bounds for each leftover runner, ended side by side",
    "LEFTOVER_RUNNER_RESUME_SECONDS = 1.0",
    "LEFTOVER_RUNNER_INTERRUPT_SECONDS = 10.0",
    "LEFTOVER_RUNNER_KILL_SECONDS = 2.0",
    "LEFTOVER_RUNNER_POLL_SECONDS = 0.05",
)
"""What the PR appends to constants.py."""

_RUNNER: Final = "src/exo/worker/runner/"
_TESTS: Final = "src/exo/worker/tests/unittests/test_runner/"
RECORDS_MODULE: Final = f"{_RUNNER}runner_record.py"
WATCH_MODULE: Final = f"{_RUNNER}parent_watch.py"
SWEEP_MODULE: Final = f"{_RUNNER}leftover_runners.py"
RELAY_MODULE: Final = f"{_RUNNER}task_relay.py"
WATCH_TEST: Final = f"{_TESTS}test_parent_watch.py"
SWEEP_TEST: Final = f"{_TESTS}test_leftover_runners.py"
LOCAL_MODULE: Final = "src/exo/worker/orphan_guard.py"

FootprintName = Literal["work queue", "relay", "with package"]


@final
@dataclass(frozen=True, slots=True)
class Hook:
    anchor: anchors.AnchorName
    block: tuple[str, ...]
    """The import, a blank line, the call, a blank line."""
    import_at_top: bool = True
    """Whether `imports_at_top` moves the import up; not where its module must be
    imported after `entrypoint` has set the runner's logger."""

    @property
    def file(self) -> str:
        return anchors.FILES[self.anchor]


@final
@dataclass(frozen=True, slots=True)
class Footprint:
    name: FootprintName
    root: Path
    """Where the files it adds are."""
    patches: tuple[tuple[str, ...], ...]
    """The files of each of its patches, in order: added files, hooked files and
    constants.py (the settings)."""
    hooks: tuple[Hook, ...]
    settings: tuple[str, ...] = ()

    @property
    def added(self) -> tuple[str, ...]:
        hooked = {hook.file for hook in self.hooks} | {anchors.CONSTANTS_FILE}
        return tuple(path for group in self.patches for path in group if path not in hooked)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(path for group in self.patches for path in group)


def _block(module: str, name: str, call: str) -> tuple[str, ...]:
    return (f"from {module} import {name}", "", call, "")


WATCH_HOOK: Final = Hook(
    "Runner.main",
    _block(
        "exo.worker.runner.parent_watch",
        "watch_parent",
        "watch_parent(self.bound_instance, self._work_queue.put)",
    ),
)
RELAY_HOOK: Final = Hook(
    "entrypoint",
    _block(
        "exo.worker.runner.task_relay",
        "relay_tasks",
        "task_receiver = relay_tasks(bound_instance, task_receiver)",
    ),
    import_at_top=False,
)
SWEEP_HOOK: Final = Hook(
    "Worker.plan_step",
    _block(
        "exo.worker.runner.leftover_runners", "end_leftover_runners", "await end_leftover_runners()"
    ),
)
LOCAL_HOOK: Final = Hook(
    "Worker.plan_step", _block("exo.worker.orphan_guard", "guard_worker", "await guard_worker()")
)

WORK_QUEUE: Final = Footprint(
    "work queue",
    EXO_TREE,
    (
        (RECORDS_MODULE, anchors.CONSTANTS_FILE),
        (WATCH_MODULE, anchors.RUNNER_FILE, WATCH_TEST),
        (SWEEP_MODULE, anchors.WORKER_FILE, SWEEP_TEST),
    ),
    (WATCH_HOOK, SWEEP_HOOK),
    SETTINGS,
)
"""The PR, for exo's runner with its own task queue (exo main)."""
RELAY: Final = Footprint(
    "relay",
    EXO_TREE,
    (
        (RECORDS_MODULE, anchors.CONSTANTS_FILE),
        (WATCH_MODULE, RELAY_MODULE, anchors.ENTRYPOINT_FILE),
        (SWEEP_MODULE, anchors.WORKER_FILE),
    ),
    (RELAY_HOOK, SWEEP_HOOK),
    SETTINGS,
)
"""The PR, for exo's runners before their own task queue (releases up to v1.0.71);
the tests, written for exo main's runner and worker, stay out."""
WITH_PACKAGE: Final = Footprint(
    "with package",
    EXO_TREE_WITH_PACKAGE,
    ((LOCAL_MODULE, anchors.WORKER_FILE),),
    (LOCAL_HOOK,),
)
"""This project's part inside exo, on top of the PR."""
