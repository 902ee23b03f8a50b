"""The anchors the hooks can sit on, found with `ast` in made-up sources (each way one
can be lost is named), and, with EXO_SRC, in every exo release since v1.0.61 and main."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from exo_orphan_guard.exo import anchors
from exo_orphan_guard.exo.anchors import Found, Missing
from tests.helpers.exo_trees import exo_src

BOOTSTRAP = """\
import os

from exo.shared.types.worker.instances import BoundInstance


def helper() -> None:
    pass


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
    def __init__(self) -> None:
        self.x = 1

    async def plan_step(self):
        while (True):  # parentheses and comments are not the anchor
            await anyio.sleep(0.1)
"""

CONSTANTS = """\
import os
import sys

EXO_CACHE_HOME = Path.home() / ".exo"
EXO_OFFLINE = os.getenv("EXO_OFFLINE", "false").lower() == "true"
"""

TASKS = """\
class BaseTask(TaggedModel):
    task_id: TaskId = Field(default_factory=TaskId)
    instance_id: InstanceId


class Shutdown(BaseTask):  # emitted by Worker
    runner_id: RunnerId
"""


def missing(anchor: anchors.Anchor) -> Missing:
    assert isinstance(anchor, Missing), anchor
    return anchor


def test_entrypoint_is_found_with_its_lines_and_indentation() -> None:
    found = anchors.entrypoint(BOOTSTRAP)
    assert found == Found(
        "entrypoint",
        anchors.ENTRYPOINT_FILE,
        line=10,
        body_line=21,
        indent="        ",
        detail="entrypoint(bound_instance, event_sender, task_receiver, cancel_receiver, _logger)",
    )
    assert found.describe() == (f"entrypoint: found, {anchors.ENTRYPOINT_FILE}:10 ({found.detail})")


def test_entrypoint_before_v1_0_68_has_no_cancel_receiver_and_tabs_are_kept() -> None:
    source = (
        "def entrypoint(bound_instance, event_sender, task_receiver, _logger):\n"
        "\tlogger = _logger\n\ttry:\n\t\tpass\n\tfinally:\n\t\tpass\n"
    )
    found = anchors.entrypoint(source)
    assert isinstance(found, Found) and found.indent == "\t\t" and found.body_line == 4


@pytest.mark.parametrize(
    "body",
    [
        "    pass\n",
        "    try:\n        pass\n    finally:\n        pass\n    logger = _logger\n",
    ],
)
def test_an_entrypoint_without_its_try_after_the_logger_has_no_place(body: str) -> None:
    """The runner's hook goes inside exo's error handling, after the runner's logger."""
    source = f"def entrypoint(bound_instance, event_sender, task_receiver, _logger):\n{body}"
    lost = missing(anchors.entrypoint(source))
    assert lost.reason == "first statement differs"
    assert "no `try` after `logger = _logger`" in lost.detail


RUNNER = """\
class Runner:
    def __init__(self):
        self._work_queue = queue.Queue()

    def main(self):
        self._start_task_reader()
        try:
            pass
        finally:
            pass
"""


def test_runner_main_is_found_where_the_runner_feeds_its_own_task_queue() -> None:
    found = anchors.runner_main(RUNNER)
    assert isinstance(found, Found) and (found.line, found.indent) == (5, "        ")
    hooked = RUNNER.replace(
        "        self._start_task_reader()",
        "        watch_parent(self.bound_instance, self._work_queue.put)\n\n"
        "        self._start_task_reader()",
    )
    assert anchors.runner_main(hooked).found
    for lost in (
        RUNNER.replace("self._work_queue = queue.Queue()", "pass"),
        RUNNER.replace("self._start_task_reader()", "self.loop()"),
        None,
    ):
        assert not anchors.runner_main(lost).found


@pytest.mark.parametrize(
    ("parameters", "detail"),
    [
        (
            "bound_instance, event_sender, tasks, _logger",
            "parameter 3 is `tasks`, expected `task_receiver`",
        ),
        (
            "bound_instance, event_sender, task_receiver, cancel, _logger",
            "parameter 4 is `cancel`, expected `_logger` (or `cancel_receiver`)",
        ),
        (
            "bound_instance, event_sender, task_receiver",
            "parameter 4, `_logger`, is missing (3 given)",
        ),
        (
            "bound_instance, event_sender, task_receiver, _logger, extra",
            "parameter 5, `extra`, is one too many (and has no default)",
        ),
        (
            "bound_instance, event_sender, task_receiver, _logger, *, extra",
            "keyword-only parameter `extra` without a default",
        ),
        (
            "bound_instance, event_sender, task_receiver, _logger, **options",
            "`*args` or `**kwargs`, which exo's entrypoint does not have",
        ),
    ],
)
def test_a_different_signature_names_the_parameter(parameters: str, detail: str) -> None:
    lost = missing(anchors.entrypoint(f"def entrypoint({parameters}):\n    pass\n"))
    assert (lost.reason, lost.detail) == ("signature differs", detail)
    assert lost.describe() == (
        f"entrypoint: missing, {anchors.ENTRYPOINT_FILE}: signature differs: {detail}"
    )


@pytest.mark.parametrize(
    ("source", "reason", "detail"),
    [
        (None, "file missing", f"no {anchors.ENTRYPOINT_FILE}"),
        ("def entrypoint(:\n", "cannot parse", "line 1: invalid syntax"),
        ("def main(): pass\n", "definition missing", "no top-level `def entrypoint`"),
        (
            "class Runner:\n    def entrypoint(self): pass\n",
            "definition missing",
            "no top-level `def entrypoint`",
        ),
        (
            "async def entrypoint(bound_instance, event_sender, task_receiver, _logger): pass\n",
            "signature differs",
            "`entrypoint` is `async def`",
        ),
    ],
)
def test_a_lost_entrypoint_says_how(source: str | None, reason: str, detail: str) -> None:
    lost = missing(anchors.entrypoint(source))
    assert (lost.file, lost.reason, lost.detail) == (anchors.ENTRYPOINT_FILE, reason, detail)


def test_more_parameters_with_defaults_keep_the_anchor() -> None:
    """exo's main line had `pipe_fifo_paths=None` after `_logger` for four commits
    (v1.0.63-185 to -188, 2026-02-17): exo's call, and a hook at the top, do not mind."""
    source = BOOTSTRAP.replace(
        '    _logger: "loguru.Logger",\n',
        '    _logger: "loguru.Logger",\n    pipe_fifo_paths: tuple[str, str] | None = None,\n'
        "    *,\n    debug: bool = False,\n",
    )
    found = anchors.entrypoint(source)
    assert isinstance(found, Found)
    assert found.detail == (
        "entrypoint(bound_instance, event_sender, task_receiver, cancel_receiver, _logger); "
        "with defaults: pipe_fifo_paths, debug"
    )


def test_the_last_definition_is_the_one_python_keeps() -> None:
    source = BOOTSTRAP + "\n\ndef entrypoint(bound_instance):\n    pass\n"
    lost = missing(anchors.entrypoint(source))
    assert lost.detail == "parameter 2, `event_sender`, is missing (1 given)"


def test_worker_plan_step_is_found_by_its_first_statement_as_a_tree() -> None:
    found = anchors.worker_plan_step(WORKER)
    assert isinstance(found, Found)
    assert (found.line, found.body_line, found.indent) == (5, 6, "        ")


def test_a_hooked_plan_step_keeps_its_anchor() -> None:
    """The series' own lines before the loop are not what the anchor looks for: a
    hooked tree is found as it was (for `patch check` and `revert`)."""
    beside = WORKER.replace(
        "        while",
        "        from exo.worker.orphan_guard import guard_worker\n\n"
        "        await guard_worker()\n\n        while",
    )
    at_top = WORKER.replace("        while", "        await guard_worker()\n\n        while")
    for source in (beside, at_top):
        assert isinstance(anchors.worker_plan_step(source), Found), source
    other = WORKER.replace("        while", "        await something_else()\n        while")
    assert missing(anchors.worker_plan_step(other)).reason == "first statement differs"


@pytest.mark.parametrize(
    ("source", "reason", "detail"),
    [
        (None, "file missing", f"no {anchors.WORKER_FILE}"),
        ("class Node:\n    pass\n", "definition missing", "no top-level `class Worker`"),
        (
            "class Worker:\n    async def start(self): pass\n",
            "definition missing",
            "`class Worker` has no method `plan_step`",
        ),
        (
            "class Worker:\n    def plan_step(self):\n        while True: pass\n",
            "signature differs",
            "`Worker.plan_step` is not `async def`",
        ),
        (
            "class Worker:\n    async def plan_step(self, tg):\n        while True: pass\n",
            "signature differs",
            "`Worker.plan_step(self, tg)`, expected `self`",
        ),
        (
            "class Worker:\n    async def plan_step(self):\n        '''Plan.'''\n"
            "        while True: pass\n",
            "first statement differs",
            "`'''Plan.'''` at line 3, expected `while True:`",
        ),
        (
            "class Worker:\n    async def plan_step(self):\n        while self.running: pass\n",
            "first statement differs",
            "`while self.running: pass` at line 3, expected `while True:`",
        ),
    ],
)
def test_a_lost_worker_plan_step_says_how(source: str | None, reason: str, detail: str) -> None:
    lost = missing(anchors.worker_plan_step(source))
    assert (lost.file, lost.reason, lost.detail) == (anchors.WORKER_FILE, reason, detail)


def test_constants_are_found_by_their_import_of_os() -> None:
    found = anchors.constants(CONSTANTS)
    assert isinstance(found, Found) and found.anchor == "constants"
    lost = missing(anchors.constants(CONSTANTS.replace("import os\n", "from os import getenv\n")))
    assert (lost.file, lost.reason) == (anchors.CONSTANTS_FILE, "import missing")
    no_cache = missing(anchors.constants(CONSTANTS.replace("EXO_CACHE_HOME", "CACHE")))
    assert (no_cache.reason, no_cache.detail) == ("field missing", "no top-level `EXO_CACHE_HOME`")
    assert missing(anchors.constants(None)).reason == "file missing"
    assert missing(anchors.constants("import os\nx = (\n")).reason == "cannot parse"


def test_shutdown_is_found_with_a_field_from_its_base() -> None:
    found = anchors.shutdown(TASKS)
    assert isinstance(found, Found)
    assert (found.line, found.body_line) == (6, 7)
    assert found.detail == "Shutdown(BaseTask): instance_id from BaseTask, runner_id from Shutdown"


@pytest.mark.parametrize(
    ("source", "reason", "detail"),
    [
        (None, "file missing", f"no {anchors.TASKS_FILE}"),
        ("class Stop(BaseTask):\n    runner_id: str\n", "definition missing", None),
        (
            TASKS.replace("runner_id: RunnerId", "runner: RunnerId"),
            "field missing",
            "`Shutdown` has no `runner_id`",
        ),
        (
            TASKS.replace("    instance_id: InstanceId\n", ""),
            "field missing",
            "`Shutdown` has no `instance_id`",
        ),
        # Bases that name each other: looked at once each.
        (
            "class A(B):\n    x: int\nclass B(A):\n    y: int\n"
            "class Shutdown(A):\n    runner_id: str\n",
            "field missing",
            "`Shutdown` has no `instance_id`",
        ),
    ],
)
def test_a_lost_shutdown_says_how(source: str | None, reason: str, detail: str | None) -> None:
    lost = missing(anchors.shutdown(source))
    assert (lost.file, lost.reason) == (anchors.TASKS_FILE, reason)
    assert detail is None or lost.detail.startswith(detail), lost.detail


def test_find_reads_a_tree_and_says_which_file_is_missing(tmp_path: Path) -> None:
    for relative, text in (
        (anchors.ENTRYPOINT_FILE, BOOTSTRAP),
        (anchors.WORKER_FILE, WORKER),
        (anchors.CONSTANTS_FILE, CONSTANTS),
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    (tmp_path / anchors.TASKS_FILE).parent.mkdir(parents=True)
    (tmp_path / anchors.TASKS_FILE).write_bytes(b"\xff\xfe not utf-8")
    found = anchors.find(tmp_path)
    assert [anchor.anchor for anchor in found] == [
        "entrypoint",
        "Worker.plan_step",
        "constants",
        "Shutdown",
        "Runner.main",
    ]
    assert all(anchor.found for anchor in found[:3]) and not anchors.all_found(found)
    assert missing(found[3]).reason == "file unreadable"
    (tmp_path / anchors.TASKS_FILE).unlink()
    assert missing(anchors.find(tmp_path)[3]).reason == "file missing"


RELEASES = [f"v1.0.{minor}" for minor in range(61, 72)]


# main, and the main-line commit whose entrypoint had a defaulted sixth parameter.
@pytest.mark.parametrize("ref", [*RELEASES, "b5375f8cee43", "a962a28af"])
def test_every_release_since_v1_0_61_and_main_has_every_anchor(ref: str) -> None:
    source = exo_src()

    def show(relative: str) -> str | None:
        shown = subprocess.run(
            ["git", "-C", str(source), "show", f"{ref}:{relative}"],
            capture_output=True,
            text=True,
            check=False,
        )
        return shown.stdout if shown.returncode == 0 else None

    found = (
        anchors.entrypoint(show(anchors.ENTRYPOINT_FILE)),
        anchors.worker_plan_step(show(anchors.WORKER_FILE)),
        anchors.constants(show(anchors.CONSTANTS_FILE)),
        anchors.shutdown(show(anchors.TASKS_FILE)),
    )
    assert anchors.all_found(found), [anchor.describe() for anchor in found]
    entry = found[0]
    assert isinstance(entry, Found)
    with_cancel = ref not in RELEASES or int(ref.rsplit(".", 1)[1]) >= 68  # not 69
    assert ("cancel_receiver" in entry.detail) == with_cancel
    # The runner's own task queue: on main, in no release.
    assert anchors.runner_main(show(anchors.RUNNER_FILE)).found == (ref == "b5375f8cee43")
