"""Where the series' lines go in files of exo's shape, pure: the settings after the last
statement of `constants.py` with the blank lines ruff format wants (checked by ruff),
the worker's import where ruff's isort puts it, and the trees with no such place
refused with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.exo import anchors, placement
from exo_orphan_guard.rig import exo_runner
from tests.test_placement import ENTRYPOINT, RUFF, TASKS, WORKER

CACHE = b"EXO_CACHE_HOME = None\n"


def _contents(constants: bytes, worker: bytes = WORKER) -> dict[str, bytes | None]:
    return {
        anchors.ENTRYPOINT_FILE: b"from exo.a import b\n\n\n" + ENTRYPOINT,
        anchors.WORKER_FILE: worker,
        anchors.CONSTANTS_FILE: constants,
        anchors.TASKS_FILE: TASKS.encode(),
    }


def _placed(contents: dict[str, bytes | None]) -> placement.Placed | placement.Problem:
    return placement.placement(contents, placement.RELAY)


@pytest.mark.parametrize(
    ("ending", "blank"),
    [
        (b"X = 1\n", 1),
        (b"def f():\n    return 1\n", 2),
        (b"class C:\n    x = 1\n", 2),
        (b"if X:\n    Y = 1\n\n    def f():\n        return 1\n", 2),
        (b"if X:\n    Y = 1\nelse:\n    Y = 2\n", 1),
        (b"try:\n    Y = 1\nexcept E:\n    Y = 2\n\n    def f():\n        return 1\n", 2),
    ],
)
@pytest.mark.skipif(not RUFF.exists(), reason=f"no ruff beside {sys.executable}")
def test_the_settings_follow_constants_with_the_blank_lines_ruff_format_wants(
    tmp_path: Path, ending: bytes, blank: int
) -> None:
    constants = b'import os\n\nX = os.getenv("X")\n' + CACHE + b"\n\n" + ending
    placed = _placed(_contents(constants))
    assert isinstance(placed, placement.Placed)
    patched = placed.patched[anchors.CONSTANTS_FILE]
    settings = "".join(f"{line}\n" for line in placement.SETTINGS).encode()
    assert patched == constants + b"\n" * blank + settings
    (tmp_path / "constants.py").write_bytes(patched or b"")
    formatted = subprocess.run(
        [str(RUFF), "format", "--check", "--no-cache", "--isolated", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert formatted.returncode == 0, formatted.stdout
    again = _placed({**_contents(constants), **placed.patched})
    assert isinstance(again, placement.Placed) and again.state == "applied"
    assert again.original[anchors.CONSTANTS_FILE] == constants


@pytest.mark.parametrize(
    ("constants", "says"),
    [
        (b"import os\n\n" + CACHE + b"EXO_ORPHAN_GUARD = True\n", "already has EXO_ORPHAN_GUARD"),
        (b"import os\n\n" + CACHE + b"X = 1", "does not end in one line ending after its code"),
        (
            b"import os\n\n" + CACHE + b"X = 1\n\n",
            "does not end in one line ending after its code",
        ),
        (b"from os import getenv\n" + CACHE, "no top-level `import os`"),
        (b"import os\n", "no top-level `EXO_CACHE_HOME`"),
    ],
)
def test_constants_with_no_place_for_the_settings_are_refused_as_an_anchor(
    constants: bytes, says: str
) -> None:
    problem = _placed(_contents(constants))
    assert isinstance(problem, placement.Problem) and says in problem.reason
    assert problem.anchor is not None and problem.file == anchors.CONSTANTS_FILE


@pytest.mark.parametrize(
    ("head", "where"),
    [
        # After the last exo import that sorts before it, even with a comment between.
        (b"from exo.a import b\n# the runner\nfrom exo.z import y\n", 1),
        (b"import anyio\n\nfrom exo.zz import y\n", 2),  # before the first one
        (b"from exo.a import (\n    b,\n    c,\n)\nfrom exo.z import y\n", 4),
    ],
)
def test_the_import_goes_where_ruffs_isort_puts_it(head: bytes, where: int) -> None:
    worker = head + b"\n\n" + WORKER
    placed = _placed(_contents(b"import os\n" + CACHE, worker))
    assert isinstance(placed, placement.Placed)
    at_top = placement.imports_at_top(placed)
    assert isinstance(at_top, placement.Placed)
    lines = (at_top.patched[anchors.WORKER_FILE] or b"").splitlines()
    assert lines[where] == (b"from exo.worker.runner.leftover_runners import end_leftover_runners")
    assert b"        await end_leftover_runners()" in lines
    # The relay's import stays beside its call, where the runner's logger is set.
    bootstrap = at_top.patched[anchors.ENTRYPOINT_FILE] or b""
    assert b"        from exo.worker.runner.task_relay import relay_tasks\n" in bootstrap


@pytest.mark.parametrize(
    ("worker", "says"),
    [
        (WORKER, "no top-level `from exo.` import"),
        (WORKER + b"\n\nfrom exo.a import b\n", "exo's imports come after the place"),
    ],
)
def test_imports_that_cannot_go_at_the_top_say_why(worker: bytes, says: str) -> None:
    placed = _placed(_contents(b"import os\n" + CACHE, worker))
    assert isinstance(placed, placement.Placed)
    problem = placement.imports_at_top(placed)
    assert isinstance(problem, placement.Problem) and says in problem.reason


def test_the_exo_shaped_rig_reads_the_settings_with_the_lines_the_series_appends() -> None:
    rig = Path(exo_runner.EXO_SHAPED, "exo", "shared", "constants.py").read_text()
    settings = "".join(f"{line}\n" for line in placement.SETTINGS)
    assert rig.endswith(f"\n\n{settings}")
