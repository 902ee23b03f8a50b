"""What shows that a process runs exo (`sweeper.exo_detect`), and where it shows: on
disk (the frozen app's layout, exo's environment), in a command line, and in the files
a real process maps, read by each backend (`system.mapped_files`).

The mechanism is measured on real processes with the stand-in of exo's extension
(`rig.stand_in_exo`; exo's own Rust extension cannot be built here): a spawn child
re-runs its parent's main script as `__mp_main__` and so maps what that script
imported, as the runners of exo's console script do; a child of a `-m` package or of
`-c` code does not, as the runners of `python -m exo` do not."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig.stand_in_exo import EXTENSION_MODULE
from exo_orphan_guard.sweeper import process_table
from exo_orphan_guard.sweeper.exo_detect import (
    ExoExecutables,
    environment_has_exo,
    exo_extension,
    is_exo_extension,
    is_frozen_exo,
)
from exo_orphan_guard.sweeper.process_table import SPAWN_CHILD_FLAG
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.lookalikes import crash, start_reporting, write_exo_main
from tests.helpers.processes import kill_all, make_fake_exo_environment


@pytest.mark.parametrize(
    ("name", "exo"),
    [
        ("exo_rs.cpython-313-darwin.so", True),
        ("exo_rs.abi3.so", True),
        ("exo_pyo3_bindings.cpython-313-x86_64-linux-gnu.so", True),
        ("exo_rs.so", True),
        ("exo_rs.dylib", False),
        ("libexo_rs.so", False),
        ("exo_rs.py", False),
        ("exo_rsx.cpython-313-darwin.so", False),
        ("mlx.core.cpython-313-darwin.so", False),
    ],
)
def test_exos_extension_by_its_file_name(name: str, exo: bool) -> None:
    assert is_exo_extension(f"/x/site-packages/exo_rs/{name}") == exo
    assert (exo_extension(["/usr/lib/libc.so.6", f"/x/{name}"]) is not None) == exo


def _frozen_app(root: Path, extension: str | None) -> Path:
    """A PyInstaller onedir layout: `exo`, and its `_internal` contents directory."""
    app = root / "EXO.app" / "Contents" / "Resources" / "exo"
    (app / "_internal" / "exo_rs").mkdir(parents=True)
    (app / "exo").write_bytes(b"\x7fELF")
    if extension is not None:
        (app / "_internal" / extension).write_bytes(b"")
    return app / "exo"


def test_the_frozen_app_is_exo_by_what_it_bundles(tmp_path: Path) -> None:
    assert is_frozen_exo(str(_frozen_app(tmp_path / "a", "exo_rs/exo_rs.cpython-313-darwin.so")))
    flat = _frozen_app(tmp_path / "b", "exo_pyo3_bindings.cpython-313-darwin.so")
    assert is_frozen_exo(str(flat))
    # Any other binary named `exo` proves nothing.
    assert not is_frozen_exo(str(_frozen_app(tmp_path / "c", None)))
    lone = tmp_path / "bin" / "exo"
    lone.parent.mkdir()
    lone.write_bytes(b"")
    assert not is_frozen_exo(str(lone))
    assert not is_frozen_exo("exo")


def test_exos_own_command_line_counts_for_a_live_process_only(tmp_path: Path) -> None:
    python = make_fake_exo_environment(tmp_path / "venv")
    script, _ = write_exo_main(python)
    detect = ExoExecutables()
    nothing = lambda: frozenset[str]()  # noqa: E731
    assert detect.runs_exo_command((python, script, "--no-api"))
    assert detect.runs_exo_command((python, "-u", "-X", "dev", "-m", "exo"))
    assert not detect.runs_exo_command((python, "pool.py"))
    assert not detect.runs_exo_command((python, "-m", "mlx_lm.server"))
    assert not detect.runs_exo_command(("/usr/bin/python3", "-m", "exo")), "no exo there"
    elsewhere = tmp_path / "other" / "bin" / "exo"
    elsewhere.parent.mkdir(parents=True)
    assert not detect.runs_exo_command((python, str(elsewhere)))
    argv = (python, script)
    assert detect.evidence(argv, None, nothing, alive_parent=True) is not None
    assert detect.evidence(argv, None, nothing, alive_parent=False) is None
    assert environment_has_exo(str(Path(python).parent.parent))


def test_exos_environment_alone_is_resemblance_not_evidence(tmp_path: Path) -> None:
    python = make_fake_exo_environment(tmp_path / "venv")
    detect = ExoExecutables()
    runner = (python, "-c", "from multiprocessing.spawn import spawn_main", SPAWN_CHILD_FLAG)
    assert detect.in_environment(runner, None)
    assert detect.evidence(runner, None, lambda: frozenset(), alive_parent=False) is None


@pytest.fixture(scope="module")
def standin_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """exo's environment, with a stand-in of exo's main module and its extension."""
    python = make_fake_exo_environment(tmp_path_factory.mktemp("evidence") / "venv")
    write_exo_main(python)
    return python


@pytest.fixture
def started() -> Iterator[list[ProcessIdentity]]:
    processes: list[ProcessIdentity] = []
    yield processes
    kill_all(processes)


def _evidence(pid: int) -> str | None:
    """As a sweep's snapshot reads it: a parent of spawn children, or a spawn child."""
    snapshot = process_table.gather([pid], fingerprint=True, match=None)
    return snapshot.processes[Pid(pid)].exo_evidence


def _start(
    argv: list[str], started: list[ProcessIdentity]
) -> tuple[subprocess.Popen[str], int, int]:
    """A stand-in exo main and its runner (which said so once it runs), both planted."""
    process, line = start_reporting(argv)
    parent, runner = (int(word) for word in line.split())
    started.extend(identity for pid in (parent, runner) if (identity := identity_of(pid)))
    return process, parent, runner


def _crash(process: subprocess.Popen[str], runner: int, started: list[ProcessIdentity]) -> None:
    crashed = crash(process, [runner])
    started.extend(crashed.helpers)


def test_a_process_that_imported_exos_extension_maps_it(
    standin_python: str, started: list[ProcessIdentity]
) -> None:
    _, parent, _ = _start([str(Path(standin_python).parent / "exo")], started)
    found = exo_extension(system.mapped_files(parent) or ())
    assert found is not None and os.path.basename(found).startswith(f"{EXTENSION_MODULE}.")
    assert system.mapped_files(2**22 + 1) is None, "gone"


def test_a_runner_of_exos_console_script_maps_the_extension_too(
    standin_python: str, started: list[ProcessIdentity]
) -> None:
    """`<env>/bin/exo`, as `uv run exo` starts it: multiprocessing re-runs the script
    as `__mp_main__` in the child, and the script imports exo's main module."""
    process, parent, runner = _start([str(Path(standin_python).parent / "exo")], started)
    assert _evidence(parent) is not None
    snapshot = process_table.gather([runner], fingerprint=True, match=None).processes
    assert snapshot[Pid(runner)].exo_evidence is None, "its live parent shows exo: not looked for"
    assert exo_extension(system.mapped_files(runner) or ()) is not None
    _crash(process, runner, started)
    assert "maps exo's extension" in str(_evidence(runner))


def test_a_runner_of_python_dash_m_maps_nothing_of_exos(
    standin_python: str, started: list[ProcessIdentity]
) -> None:
    """`python -m exo`: multiprocessing never re-runs a `__main__` module in a child,
    and nothing a runner itself imports maps exo's extension."""
    process, parent, runner = _start([standin_python, "-m", "exo_standin_pkg"], started)
    assert "maps exo's extension" in str(_evidence(parent))
    assert exo_extension(system.mapped_files(runner) or ()) is None
    _crash(process, runner, started)
    assert _evidence(runner) is None
