"""A tree the hooks have no place in is refused honestly: which anchor in which file,
which exo (git describe), "local edits" only where git sees them in the files the
hooks would touch, what to do; and nothing in the tree (or its git index) changes. A
pristine tree of another version is not refused at all: the hooks are placed at its
anchors.

The trees are small fake exos made in tmp, git repositories of their own: the files
the series expects (tests/test_patching.py's `build_tree`), with real Python where
the anchors live."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from exo_orphan_guard.exo import anchors, patching, placement, refusal
from exo_orphan_guard.tools import cli
from tests.test_patching import SERIES, build_tree, snapshot

GIT = ["git", "-c", "user.name=exo-orphan-guard test", "-c", "user.email=test@invalid"]
MAIN = next(series for series in SERIES if series.name == "main")

BOOTSTRAP = """\
import loguru

from exo.utils.channels import MpReceiver, MpSender


def entrypoint(
    bound_instance: BoundInstance,
    event_sender: MpSender[Event],
    task_receiver: MpReceiver[Task],
    cancel_receiver: MpReceiver[TaskId],
    _logger: "loguru.Logger",
) -> None:
    global logger
    logger = _logger
    try:
        run()
    finally:
        close()
"""
WORKER = """\
class Worker:
    async def plan_step(self):
        while True:
            await anyio.sleep(0.1)
"""
CONSTANTS = """\
import os

EXO_CACHE_HOME = Path.home() / ".exo"
EXO_OFFLINE = os.getenv("EXO_OFFLINE", "false").lower() == "true"
"""
TASKS = """\
class BaseTask(TaggedModel):
    instance_id: InstanceId


class Shutdown(BaseTask):
    runner_id: RunnerId
"""


def git(tree: Path, *arguments: str) -> str:
    return subprocess.run(
        [*GIT, "-C", str(tree), *arguments], capture_output=True, text=True, check=True
    ).stdout


def fitting_tree(tree: Path, *, tag: str | None = None) -> dict[str, bytes]:
    """The tree the main series fits, plus the one anchor file it does not touch; a git
    repository at one commit if `tag` is given."""
    build_tree(tree, MAIN)
    (tree / anchors.TASKS_FILE).parent.mkdir(parents=True)
    (tree / anchors.TASKS_FILE).write_text(TASKS)
    if tag is not None:
        commit(tree, tag)
    return snapshot(tree)


def another_exo(tree: Path, *, tag: str | None = "v9.9.9") -> None:
    """A pristine exo of another version: bootstrap.py and main.py differ from what the
    series expects (as exo v1.0.70's do from v1.0.71's), the anchors are in place."""
    fitting_tree(tree)
    (tree / anchors.ENTRYPOINT_FILE).write_text(BOOTSTRAP)
    (tree / anchors.WORKER_FILE).write_text(WORKER)
    (tree / anchors.CONSTANTS_FILE).write_text(CONSTANTS)
    if tag is not None:
        commit(tree, tag)


def commit(tree: Path, tag: str) -> None:
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "exo")
    git(tree, "tag", tag)


def refused(tree: Path) -> patching.PatchError:
    with pytest.raises(patching.PatchError) as raised:
        patching.apply(tree)
    return raised.value


def unchanged(tree: Path, before: dict[str, bytes]) -> None:
    assert snapshot(tree) == before  # the work tree, and .git (its index included)


def without_worker_anchor(tree: Path) -> None:
    """Worker.plan_step's first statement is not exo's any more."""
    main = tree / anchors.WORKER_FILE
    main.write_text(main.read_text().replace("while True:", "while self.running:"))


def test_a_pristine_tree_of_another_version_is_placed_not_refused(tmp_path: Path) -> None:
    another_exo(tmp_path)
    before = snapshot(tmp_path)
    status, changed = patching.apply(tmp_path)
    assert changed and status.series.name == patching.PLACED
    assert "task_receiver = relay_tasks(bound_instance, task_receiver)" in (
        (tmp_path / anchors.ENTRYPOINT_FILE).read_text()
    )
    assert patching.revert(tmp_path)[1] is True
    unchanged(tmp_path, before)


def test_a_missing_anchor_is_named_with_its_file_and_version(tmp_path: Path) -> None:
    another_exo(tmp_path, tag=None)
    without_worker_anchor(tmp_path)
    commit(tmp_path, "v9.9.9")
    before = snapshot(tmp_path)
    error = refused(tmp_path)
    assert str(error) == (
        f"the hooks have no place in exo v9.9.9 at {tmp_path}: Worker.plan_step: missing, "
        f"{anchors.WORKER_FILE}: first statement differs: `while self.running:` at line 3, "
        "expected `while True:`; nothing changed"
    )
    assert "local edits" not in str(error)
    edits, version, *found, advice = error.details
    assert edits.startswith("local edits: none (the files the series touches are as the tree's")
    assert version == "exo version: v9.9.9 (git describe --tags)"
    assert found == [
        f"anchor entrypoint: found, {anchors.ENTRYPOINT_FILE}:6 (entrypoint(bound_instance, "
        "event_sender, task_receiver, cancel_receiver, _logger))",
        f"anchor Worker.plan_step: missing, {anchors.WORKER_FILE}: first statement differs: "
        "`while self.running:` at line 3, expected `while True:`",
        f"anchor constants: found, {anchors.CONSTANTS_FILE}:1 (`import os` and "
        "`EXO_CACHE_HOME` at the top level)",
        f"anchor Shutdown: found, {anchors.TASKS_FILE}:5 (Shutdown(BaseTask): instance_id from "
        "BaseTask, runner_id from Shutdown)",
    ]
    assert advice.startswith("what to do: this tree lacks Worker.plan_step, which every exo since")
    unchanged(tmp_path, before)


def test_a_real_local_edit_is_named_with_git_status(tmp_path: Path) -> None:
    another_exo(tmp_path, tag="v1.0.71-40-gabcdef")
    without_worker_anchor(tmp_path)
    before = snapshot(tmp_path)
    error = refused(tmp_path)
    assert str(error).startswith(
        "the hooks have no place in the local edits in exo v1.0.71-40-gabcdef at "
        f"{tmp_path}: Worker.plan_step: missing, {anchors.WORKER_FILE}: first statement differs"
    )
    assert error.details[0] == (
        f"local edits: M {anchors.WORKER_FILE} (git status --porcelain); the series applies "
        "to the files as HEAD has them"
    )
    assert error.details[-1].startswith(
        f"what to do: set the edits aside (git -C {tmp_path} stash)"
    )
    unchanged(tmp_path, before)
    git(tmp_path, "stash", "-q")  # and with the edit set aside, the hooks go in
    assert patching.apply(tmp_path)[1] is True


def test_edits_elsewhere_are_listed_but_not_blamed(tmp_path: Path) -> None:
    another_exo(tmp_path, tag=None)
    without_worker_anchor(tmp_path)
    commit(tmp_path, "v9.9.9")
    bootstrap = tmp_path / anchors.ENTRYPOINT_FILE
    bootstrap.write_text(bootstrap.read_text().replace("import loguru", "import loguru  # mine"))
    error = refused(tmp_path)
    assert str(error).startswith("the hooks have no place in exo v9.9.9")
    assert error.details[0] == (
        f"local edits (not what stops the series): M {anchors.ENTRYPOINT_FILE} (git status "
        "--porcelain); it would not apply to the files as HEAD has them either"
    )
    assert error.details[-1].startswith("what to do: this tree lacks Worker.plan_step")


def test_a_tree_without_git_says_it_cannot_tell(tmp_path: Path) -> None:
    another_exo(tmp_path, tag=None)
    without_worker_anchor(tmp_path)
    before = snapshot(tmp_path)
    error = refused(tmp_path)
    assert str(error).startswith(f"the hooks have no place in the exo tree at {tmp_path}: ")
    assert error.details[:2] == (
        "local edits: cannot tell (not a git tree)",
        "exo version: unknown (not a git tree)",
    )
    unchanged(tmp_path, before)


def test_a_tree_inside_another_repository_is_not_that_repositorys_exo(tmp_path: Path) -> None:
    tree = tmp_path / "vendor" / "exo"
    another_exo(tree, tag=None)
    without_worker_anchor(tree)
    commit(tmp_path, "outer")
    assert refused(tree).details[1] == "exo version: unknown (not a git tree)"


def test_a_missing_shutdown_is_named_and_the_advice_says_so(tmp_path: Path) -> None:
    another_exo(tmp_path, tag=None)
    (tmp_path / anchors.TASKS_FILE).write_text(TASKS.replace("runner_id", "runner"))
    before = snapshot(tmp_path)
    error = refused(tmp_path)
    assert str(error).startswith(
        f"the hooks have no place in the exo tree at {tmp_path}: Shutdown: missing, "
        f"{anchors.TASKS_FILE}: field missing: `Shutdown` has no `runner_id`"
    )
    assert error.details[-1].startswith("what to do: this tree lacks Shutdown, which every exo")
    unchanged(tmp_path, before)


def test_a_tree_patched_then_edited_does_not_come_out_and_says_where(tmp_path: Path) -> None:
    another_exo(tmp_path, tag="v1.0.71")
    patching.apply(tmp_path)
    main = tmp_path / anchors.WORKER_FILE
    hooked = main.read_bytes()
    main.write_bytes(
        hooked.replace(b"await end_leftover_runners()", b"await end_leftover_runners()  # mine")
    )
    before = snapshot(tmp_path)
    with pytest.raises(patching.PatchError) as raised:
        patching.revert(tmp_path)
    assert str(raised.value) == (
        f"the hooks are in exo v1.0.71 at {tmp_path} but do not come out again: "
        f"{anchors.WORKER_FILE} has the series' lines where the series puts none; "
        "nothing changed"
    )
    assert raised.value.details[-1].startswith("what to do: the hooks' lines in ")
    unchanged(tmp_path, before)


def test_hooks_that_are_partly_in_are_named_not_doubled(tmp_path: Path) -> None:
    another_exo(tmp_path, tag=None)
    patching.apply(tmp_path)
    (tmp_path / placement.SWEEP_MODULE).unlink()
    before = snapshot(tmp_path)
    with pytest.raises(patching.PatchError, match="the hooks are partly in"):
        patching.apply(tmp_path)
    unchanged(tmp_path, before)


def test_the_cli_refuses_with_exit_code_2_the_line_then_the_details(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    another_exo(tmp_path, tag=None)
    without_worker_anchor(tmp_path)
    commit(tmp_path, "v9.9.9")
    before = snapshot(tmp_path)
    assert cli.main(["patch", "apply", "--exo", str(tmp_path), "--no-lock"]) == 2
    first, *rest = capsys.readouterr().err.splitlines()
    assert first.startswith("exo-orphan-guard: error: the hooks have no place in exo v9.9.9")
    assert len(rest) == 7 and all(line.startswith("  ") for line in rest)
    assert rest[1] == "  exo version: v9.9.9 (git describe --tags)"
    assert cli.main(["patch", "check", "--exo", str(tmp_path)]) == 2
    assert "no place" in capsys.readouterr().err
    unchanged(tmp_path, before)


def test_without_a_supervisor_file_the_hooks_are_still_placed(tmp_path: Path) -> None:
    another_exo(tmp_path, tag=None)
    (tmp_path / patching.SERIES_MARKERS["main"]).unlink()
    assert patching.check(tmp_path).series.name == patching.PLACED


def test_compose_is_pure_and_names_git_failures() -> None:
    mismatch = refusal.Mismatch("main", "main (b5375f8cee43)", "apply", "f.py", "f.py, hunk 1")
    facts = refusal.GitFacts("git failed", problem="detected dubious ownership")
    composed = refusal.compose(Path("/x"), mismatch, (), facts)
    assert (
        composed.line
        == "series main does not fit the exo tree at /x: f.py, hunk 1; nothing changed"
    )
    assert composed.details[:2] == (
        "local edits: cannot tell (git: detected dubious ownership)",
        "exo version: unknown (git: detected dubious ownership)",
    )
