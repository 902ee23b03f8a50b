"""EXO.app's quit and a terminal's Ctrl-C, on exo's REAL worker (issue 29, items 10 and 5).

exo's main process is played by `exo_support/app_quit_node.py`: exo's own signal
handling (`Node.run`/`Node.shutdown`) around exo's real Worker and RunnerSupervisors,
with an idle runner and a busy one (`steps_site`: inside one long `mx.eval`, or wedged:
the GIL held, every signal blocked). `helpers/app_quit.py` is the app (SIGINT, 5 s,
SIGTERM, 3 s, SIGKILL, each only while exo still runs) or the terminal (SIGINT to
exo's process group, once). One round per case here; `python -m tests.helpers.app_quit
--rounds 3` measured the tables in docs/exo.md ("EXO.app's quit", "Ctrl-C and
process groups"). The figures print with `-s`.

Needs EXO_SRC and MLX_LM_SRC, as `make test-exo`, and a private pid namespace
(`scripts/confined`), as every exo test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.app_quit import Round, run_round
from tests.helpers.exo_trees import exo_tree, exo_venv

pytestmark = [
    pytest.mark.exo,
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
]
APP_SIGKILL_AT = 8.0
WEDGED_BUSY_WAIT = 6.0
"""A short busy wait, so the guard's kill of a wedged runner comes within the round."""

APP_QUIT_VERSIONS = ["v1.0.71", "main"]
"""The two whose stop paths docs/exo.md reads (they differ): the others are older."""


def _round(version: str, exo_work: Path, exo_venv_cache: Path, **options: object) -> Round:
    tree = exo_tree(exo_work, version, patched=True)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    done = run_round(tree, venv, version, **options)  # pyright: ignore[reportArgumentType]
    print(f"\n{done.line()}")
    return done


@pytest.mark.parametrize("guard", [False, True], ids=["guard-off", "guard-on"])
@pytest.mark.parametrize("version", APP_QUIT_VERSIONS)
def test_the_apps_quit_ends_runners_the_same_guarded_or_not(
    version: str, guard: bool, exo_work: Path, exo_venv_cache: Path
) -> None:
    """exo's own stop path ends both runners hard while exo lives, guard on or off
    (issue 35 item 2: nothing changes while the worker lives): main's AsyncProcess
    SIGTERMs each after its 3 s join (the idle one too: the supervisor closes the task
    stream only after that), v1.0.71 leaves them to multiprocessing's atexit."""
    done = _round(version, exo_work, exo_venv_cache, guard=guard, scenario="app")
    assert done.exo_end_s is not None, done
    for end in (done.runners["idle"], done.runners["busy"]):
        assert end.by == "exo" and end.how.startswith("SIGTERM"), done
        # Measured: 3.0-3.1 s on main, 1.7-4.3 s on v1.0.71 (docs/exo.md).
        assert end.gone_s is not None and end.gone_s < APP_SIGKILL_AT, done


@pytest.mark.parametrize("guard", [False, True], ids=["guard-off", "guard-on"])
def test_a_wedged_runner_outlives_the_apps_quit_guarded_or_not(
    guard: bool, exo_work: Path, exo_venv_cache: Path
) -> None:
    """A runner SIGTERM cannot end (in native code with the GIL held and every signal
    blocked) keeps exo's AsyncProcess escalating past the app's window: the app
    SIGKILLs exo at 8 s and the runner is orphaned, guard on or off: the Shutdown
    handed to it is never taken, and nothing inside exo kills it (the guardian, from
    outside, does). The idle runner ended through exo before that."""
    done = _round(
        "main",
        exo_work,
        exo_venv_cache,
        guard=guard,
        scenario="app",
        busy="gil",
        busy_wait=WEDGED_BUSY_WAIT,
        observe=APP_SIGKILL_AT + WEDGED_BUSY_WAIT + 8.0,
    )
    assert [name for name, _ in done.signals] == ["SIGINT", "SIGTERM", "SIGKILL"], done
    assert done.exo_exit == -9, done
    idle, wedged = done.runners["idle"], done.runners["busy"]
    assert idle.by == "exo", done
    assert wedged.by == "orphaned", done


@pytest.mark.parametrize("guard", [False, True], ids=["guard-off", "guard-on"])
@pytest.mark.parametrize("version", APP_QUIT_VERSIONS)
def test_a_terminals_ctrl_c_reaches_runners_the_same_guarded_or_not(
    version: str, guard: bool, exo_work: Path, exo_venv_cache: Path
) -> None:
    """SIGINT to exo's process group: runners share it, guarded or not (the guard
    leaves their group alone), so the idle one takes it itself (KeyboardInterrupt:
    exit 1 on main; on v1.0.71 its traceback on exo's stderr before
    multiprocessing's atexit SIGTERMs it)."""
    done = _round(version, exo_work, exo_venv_cache, guard=guard, scenario="ctrl-c")
    assert done.exo_end_s is not None, done
    for end in done.runners.values():
        # Measured: 0.5-3.1 s unguarded.
        assert end.by == "exo" and end.gone_s is not None and end.gone_s < 25.0, done
    if version == "main":
        assert done.runners["idle"].how == "exit 1", done
    else:
        assert done.keyboard_interrupts >= 1, done
