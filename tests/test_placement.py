"""The hooks placed at the anchors of trees the stored series does not fit (issue 28):
made-up exo trees of many shapes (pure); revert byte for byte; `export` then `git am`
gives the tree `apply` gives. exo's own trees: tests/test_placement_exo.py."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.exo import (
    anchors,
    format_patch,
    patching,
    placement,
)
from exo_orphan_guard.tools import cli
from tests.test_patching import snapshot

GIT = ["git", "-c", "user.name=exo-orphan-guard test", "-c", "user.email=test@invalid"]
RUFF = Path(sys.executable).parent / "ruff"
EXO_RUFF_CONFIG = (
    '[project]\nname = "exo"\n\n[tool.ruff.lint]\nextend-select = ["I", "N", "B", "A", '
    '"PIE", "SIM"]\n\n[tool.ruff.lint.isort]\nknown-first-party = ["exo"]\n'
)
TASKS = """\
class BaseTask(TaggedModel):
    instance_id: InstanceId


class Shutdown(BaseTask):
    runner_id: RunnerId
"""


CONSTANTS = [
    "import os",
    "from pathlib import Path",
    "",
    'EXO_CACHE_HOME = Path.home() / ".cache" / "exo"',
    'EXO_OFFLINE = os.getenv("EXO_OFFLINE", "false").lower() == "true"',
]
RUNNER = [
    "import queue",
    "",
    "from exo.worker.runner.bootstrap import logger",
    "",
    "",
    "class Runner:",
    "    def __init__(self, bound_instance):",
    "        self.bound_instance = bound_instance",
    "        self._work_queue = queue.Queue()",
    "",
    "    def main(self):",
    "        self._start_task_reader()",
    '        logger.info("runner running")',
]


def shaped_tree(
    root: Path,
    *,
    docstring: bool = False,
    comment: bool = False,
    cancel: bool = True,
    loop_comment: bool = True,
    crlf: bool = False,
    work_queue: bool = True,
) -> dict[str, bytes]:
    """A small exo whose anchors sit in one of the shapes exo's history has had."""
    signature = [
        "    bound_instance: BoundInstance,",
        "    event_sender: MpSender[Event],",
        "    task_receiver: MpReceiver[Task],",
        *(["    cancel_receiver: MpReceiver[TaskId],"] if cancel else []),
        '    _logger: "loguru.Logger",',
    ]
    body = [
        *(['    """The runner: set up, then run."""', ""] if docstring else []),
        "    global logger",
        "    logger = _logger",
        "",
        "    try:",
        *(["        # Run it."] if comment else []),
        '        logger.info("runner started")',
        "    finally:",
        '        logger.info("bye")',
    ]
    bootstrap = [
        "import loguru",
        "",
        "from exo.utils.channels import MpReceiver, MpSender",
        "",
        'logger: "loguru.Logger" = loguru.logger',
        "",
        "",
        "def entrypoint(",
        *signature,
        ") -> None:",
        *body,
    ]
    worker = [
        "import anyio",
        "",
        "",
        "class Worker:",
        "    async def plan_step(self):",
        *(["        # Plan every 100 ms."] if loop_comment else []),
        "        while True:",
        "            await anyio.sleep(0.1)",
    ]
    ending = "\r\n" if crlf else "\n"
    files = {
        anchors.ENTRYPOINT_FILE: ending.join(bootstrap) + ending,
        anchors.WORKER_FILE: ending.join(worker) + ending,
        anchors.TASKS_FILE: TASKS,
        anchors.CONSTANTS_FILE: ending.join(CONSTANTS) + ending,
        **({anchors.RUNNER_FILE: ending.join(RUNNER) + ending} if work_queue else {}),
        "src/exo/worker/runner/supervisor.py": "# exo main's supervisor\n",
        "pyproject.toml": EXO_RUFF_CONFIG,
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(text.encode())
    return snapshot(root)


SHAPE_NAMES: tuple[str, ...] = (
    "docstring",
    "comment",
    "cancel",
    "loop_comment",
    "crlf",
    "work_queue",
)
SHAPES: list[dict[str, bool]] = [
    dict(zip(SHAPE_NAMES, values, strict=True))
    for values in itertools.product((False, True), repeat=len(SHAPE_NAMES))
]


def shape_id(shape: dict[str, bool]) -> str:
    return "-".join(name for name, on in shape.items() if on) or "plain"


def test_every_shape_is_placed_compiles_and_reverts_byte_for_byte(tmp_path: Path) -> None:
    """64 shapes: where the blank lines, a docstring or a comment sit, cancel_receiver
    or not, CRLF or LF, the runner's own task queue or not; each applied with the local
    series, checked, applied again and reverted."""
    for number, shape in enumerate(SHAPES):
        tree = tmp_path / f"t{number}"
        original = shaped_tree(tree, **shape)
        status, changed = patching.apply(tree, with_package=True)
        assert changed and status.series.name == patching.PLACED, shape_id(shape)
        assert status.local is not None
        patched = snapshot(tree)
        newline = "\r\n" if shape["crlf"] else "\n"
        bootstrap = patched[anchors.ENTRYPOINT_FILE].decode()
        relay = (
            f"        from exo.worker.runner.task_relay import relay_tasks{newline}{newline}"
            f"        task_receiver = relay_tasks(bound_instance, task_receiver){newline}"
            f"{newline}"
        )
        if shape["work_queue"]:
            assert "relay_tasks" not in bootstrap
            assert placement.RELAY_MODULE not in patched
            runner = patched[anchors.RUNNER_FILE].decode()
            watch = (
                f"    def main(self):{newline}"
                f"        from exo.worker.runner.parent_watch import watch_parent{newline}"
                f"{newline}"
                f"        watch_parent(self.bound_instance, self._work_queue.put){newline}"
                f"{newline}        self._start_task_reader(){newline}"
            )
            assert watch in runner, shape_id(shape)
        else:
            # First in the try, after logger = _logger: inside exo's error handling.
            head, _, tail = bootstrap.partition(relay)
            assert head.rstrip().endswith("try:"), shape_id(shape)
            assert tail.lstrip().startswith("# Run" if shape["comment"] else "logger.info")
        main = patched[anchors.WORKER_FILE].decode()
        before_loop = "        # Plan" if shape["loop_comment"] else "        while True:"
        assert (
            f"        await guard_worker(){newline}{newline}"
            f"        from exo.worker.runner.leftover_runners import end_leftover_runners"
            f"{newline}{newline}        await end_leftover_runners(){newline}{newline}"
            f"{before_loop}"
        ) in main
        constants = patched[anchors.CONSTANTS_FILE].decode()
        settings = newline.join(placement.SETTINGS)
        assert constants.endswith(f'"true"{newline}{newline}{settings}{newline}')
        for path in (anchors.ENTRYPOINT_FILE, anchors.WORKER_FILE, anchors.CONSTANTS_FILE):
            compile(patched[path], path, "exec")
        status = patching.check(tree)
        assert status.state == "applied" and status.local is not None
        assert patching.apply(tree, with_package=True)[1] is False
        assert snapshot(tree) == patched
        assert patching.revert(tree)[1] is True
        assert snapshot(tree) == original, shape_id(shape)


@pytest.mark.skipif(not RUFF.exists(), reason=f"no ruff beside {sys.executable}")
def test_every_shape_patched_passes_exos_ruff_rules(tmp_path: Path) -> None:
    """With exo's rules (this checkout's ruff; exo's pinned ruff: bench/reach.py and the
    EXO_SRC tests below): the hooks add no finding and no reformatting."""
    for number, shape in enumerate(SHAPES):
        if shape["crlf"]:
            continue  # ruff format would keep CRLF; one line-ending style is enough here
        tree = tmp_path / f"t{number}"
        shaped_tree(tree, **shape)
        patching.apply(tree, with_package=True)
    files = [str(path) for path in tmp_path.rglob("*.py") if "types" not in path.parts]
    # F821: the made-up trees name exo's types without importing them. BLE001: this
    # checkout's newer ruff counts blind-except among exo's B rules; exo's 0.14 does not.
    for command in (
        ["check", "--no-cache", "--ignore", "F821", "--extend-ignore", "BLE001"],
        ["format", "--check", "--no-cache"],
    ):
        result = subprocess.run(
            [str(RUFF), *command, "--config", str(tmp_path / "t0" / "pyproject.toml"), *files],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


WORKER = b"class Worker:\n    async def plan_step(self):\n        while True:\n            pass\n"
ENTRYPOINT = (
    b"def entrypoint(bound_instance, event_sender, task_receiver, _logger):\n"
    b"    global logger\n    logger = _logger\n    try:\n        pass\n    finally:\n        pass\n"
)
CONSTANTS_SOURCE = b"import os\n\nEXO_CACHE_HOME = None\n"


def test_placement_is_pure_and_its_inverse_is_exact() -> None:
    contents: dict[str, bytes | None] = {
        anchors.ENTRYPOINT_FILE: ENTRYPOINT,
        anchors.WORKER_FILE: WORKER,
        anchors.CONSTANTS_FILE: CONSTANTS_SOURCE,
        anchors.TASKS_FILE: TASKS.encode(),
    }
    footprint = placement.pr_footprint(contents)
    assert footprint is placement.RELAY  # no runner.py: no task queue of its own
    placed = placement.placement(contents, footprint)
    assert isinstance(placed, placement.Placed) and placed.state == "not applied"
    again = placement.placement({**contents, **placed.patched}, footprint)
    assert isinstance(again, placement.Placed) and again.state == "applied"
    assert again.original == {path: contents.get(path) for path in again.original}


def test_a_tree_with_the_hooks_elsewhere_is_not_hooked_twice() -> None:
    contents: dict[str, bytes | None] = {
        anchors.ENTRYPOINT_FILE: ENTRYPOINT,
        anchors.WORKER_FILE: (
            b"from exo.worker.runner.leftover_runners import end_leftover_runners\n\n" + WORKER
        ),
        anchors.CONSTANTS_FILE: CONSTANTS_SOURCE,
        anchors.TASKS_FILE: TASKS.encode(),
    }
    problem = placement.placement(contents, placement.RELAY)
    assert isinstance(problem, placement.Problem)
    assert problem.reason.endswith("has the series' lines where the series puts none")


def git_tree(tree: Path) -> None:
    subprocess.run([*GIT, "-C", str(tree), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(tree), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(tree), "commit", "-q", "-m", "exo"], check=True)


def export_then_am(tree: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """`patch export`, then `git am` of what it wrote; the export's lines."""
    assert cli.main(["patch", "export", "--exo", str(tree), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    patches = sorted(str(path) for path in out.glob("000[1-9]-*.patch"))
    subprocess.run([*GIT, "-C", str(tree), "am", "-q", *patches], check=True)
    return lines


def test_export_of_a_placed_tree_then_git_am_gives_what_apply_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shaped = tmp_path / "applied"
    shaped_tree(shaped, docstring=True, loop_comment=False)
    patching.apply(shaped)
    tree = tmp_path / "exo"
    shaped_tree(tree, docstring=True, loop_comment=False)
    git_tree(tree)
    lines = export_then_am(tree, tmp_path / "out", capsys)
    assert lines[0].startswith(f"series {patching.PLACED}: ")
    assert lines[1] == f"state in {tree}: not applied (series placed at the anchors)"
    applied = {path: data for path, data in snapshot(shaped).items()}
    assert {
        path: data for path, data in snapshot(tree).items() if not path.startswith(".git/")
    } == applied
    log = subprocess.run(
        [*GIT, "-C", str(tree), "log", "--format=%s", "-3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert log == [
        "feature: End leftover runners before planning",
        "feature: Hand runners Shutdown if worker dies",
        "feature: Add runner records and guard settings",
    ]
    cover = (tmp_path / "out" / patching.COVER_LETTER).read_text()
    # The two calls, four lines each, and the settings after their blank line.
    new = placement.new_files(placement.WORK_QUEUE)
    added = sum(data.count(b"\n") for data in new.values()) + 8 + 1 + len(placement.SETTINGS)
    files = len(new) + 3
    assert f" {files} files changed, {added} insertions(+)\n" in cover


def test_format_patch_counts_and_blob_ids_are_gits(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"one\ntwo\n")
    blob = subprocess.run(
        ["git", "hash-object", str(tmp_path / "f")], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert format_patch.blob_id(b"one\ntwo\n") == blob
    assert format_patch.Change("f", b"a\nb\n", b"a\nc\nb\n").counts == (1, 0)
    if shutil.which("git") is None:  # pragma: no cover
        pytest.skip("no git")
