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
(`scripts/confined`): the guarded runners sweep the machine when they start.
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
def test_the_apps_quit_ends_runners_hard_unless_guarded(
    version: str, guard: bool, exo_work: Path, exo_venv_cache: Path
) -> None:
    """Unguarded, exo's own stop path ends both runners hard while exo lives: main's
    AsyncProcess SIGTERMs each after its 3 s join (the idle one too: the supervisor
    closes the task stream only after that), v1.0.71 leaves them to multiprocessing's
    atexit. Guarded, exo main's idle runner takes that SIGTERM as its own Shutdown and
    exits 0; the busy one ends clean once its eval returns (exo waits for it past the
    app's SIGKILL, and the guard ends it then). v1.0.71's idle runner has ended its
    loop (its stream closed first) and is still exiting when the atexit's SIGTERM
    comes, its handlers gone with the interpreter's: that one is exo's."""
    done = _round(version, exo_work, exo_venv_cache, guard=guard, scenario="app")
    assert done.exo_end_s is not None, done
    idle, busy = done.runners["idle"], done.runners["busy"]
    if not guard:
        for end in (idle, busy):
            assert end.by == "exo" and end.how.startswith("SIGTERM"), done
            # Measured: 3.0-3.1 s on main, 1.7-4.3 s on v1.0.71 (docs/exo.md).
            assert end.gone_s is not None and end.gone_s < APP_SIGKILL_AT, done
        return
    if version == "main":
        assert (idle.by, idle.how) == ("exo", "exit 0"), done
    else:
        assert idle.by == "exo", done
    assert busy.how == "exit 0" or (busy.by, busy.how[:5]) == ("guard", "clean"), done
    assert busy.gone_s is not None, done


@pytest.mark.parametrize("guard", [False, True], ids=["guard-off", "guard-on"])
def test_a_wedged_runner_outlives_the_apps_quit_unless_guarded(
    guard: bool, exo_work: Path, exo_venv_cache: Path
) -> None:
    """A runner SIGTERM cannot end (in native code with the GIL held and every signal
    blocked) keeps exo's AsyncProcess escalating past the app's window: the app
    SIGKILLs exo at 8 s. Unguarded, the runner is orphaned; guarded, its watchdog
    kills it at the busy wait; the idle runner ended through exo before that."""
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
    if guard:
        assert (wedged.by, wedged.step) == ("guard", "busy_wait"), done
        assert wedged.gone_s is not None
        assert APP_SIGKILL_AT < wedged.gone_s < APP_SIGKILL_AT + WEDGED_BUSY_WAIT + 5.0, done
    else:
        assert wedged.by == "orphaned", done


@pytest.mark.parametrize("guard", [False, True], ids=["guard-off", "guard-on"])
@pytest.mark.parametrize("version", APP_QUIT_VERSIONS)
def test_a_terminals_ctrl_c_reaches_unguarded_runners_only(
    version: str, guard: bool, exo_work: Path, exo_venv_cache: Path
) -> None:
    """SIGINT to exo's process group: unguarded runners share it, so the idle one takes
    it itself (KeyboardInterrupt: exit 1 on main; on v1.0.71 its traceback on exo's
    stderr before multiprocessing's atexit SIGTERMs it); guarded ones lead their own
    groups, never see it, and are stopped by exo, whose SIGTERM each takes as its own
    Shutdown (exit 0)."""
    done = _round(version, exo_work, exo_venv_cache, guard=guard, scenario="ctrl-c")
    assert done.exo_end_s is not None, done
    for end in done.runners.values():
        # Measured: 0.5-3.1 s unguarded; guarded, up to 16 s (the busy one after its eval).
        assert end.by == "exo" and end.gone_s is not None and end.gone_s < 25.0, done
    idle = done.runners["idle"]
    if guard:
        assert done.keyboard_interrupts == 0, done
        # Its own Shutdown, on exo's SIGTERM; v1.0.71 closes the stream first, and its
        # idle runner may still be exiting, its handlers gone, when the atexit's comes.
        hard = "SIGTERM (multiprocessing's atexit)"
        assert idle.how in (("exit 0", hard) if version == "v1.0.71" else ("exit 0",)), done
        assert done.runners["busy"].how == "exit 0", done  # once its eval returned
    elif version == "main":
        assert idle.how == "exit 1", done
    else:
        assert done.keyboard_interrupts >= 1, done
