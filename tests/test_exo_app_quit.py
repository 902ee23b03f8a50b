"""EXO.app's quit with a runner it cannot end, on exo's REAL worker (issue 29 item 10,
issue 35 items 2 and 3).

exo's main process is played by `exo_support/app_quit_node.py`: exo's own signal
handling (`Node.run`/`Node.shutdown`) around exo's real Worker and RunnerSupervisors,
with two runners that have taken their first task (exo's `ConnectToGroup`), one idle
and one wedged (`quit_site`: the GIL held, every signal blocked, SIGTERM ignored).
`helpers/app_quit.py` is the app: SIGINT, 5 s, SIGTERM, 3 s, SIGKILL, each only while
exo still runs. How exo's own stops end runners that can take them, guarded and not,
is `test_exo_unchanged.py`; the figures print with `-s`.

Needs EXO_SRC and MLX_LM_SRC, as `make test-exo`, and a private pid namespace
(`scripts/confined`), as every exo test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.app_quit import CONFIGS, Config, exo_for, run_round
from tests.helpers.exo_trees import exo_tree, exo_venv

pytestmark = [
    pytest.mark.exo,
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
]
APP_SIGKILL_AT = 8.0
WEDGED_BUSY_WAIT = 6.0
"""A short busy wait (the guardian inherits it), so its kill comes within the round."""
OBSERVE = APP_SIGKILL_AT + 2 * WEDGED_BUSY_WAIT + 10.0
"""exo's SIGKILL, the guardian's next scan (every 2 s), its SIGINT and busy wait, and
room to spare (measured: gone 20.0 s after the app's SIGINT)."""


@pytest.mark.parametrize("config", CONFIGS)
def test_a_wedged_runner_outlives_the_apps_quit_unless_a_guardian_runs(
    config: Config, exo_work: Path, exo_venv_cache: Path
) -> None:
    """A runner SIGTERM cannot end keeps exo's AsyncProcess escalating past the app's
    window: the app SIGKILLs exo at 8 s. The idle runner ended through exo before
    that, in every configuration. Inside exo nothing ends the wedged one: guard off
    or on without the package it is orphaned (the Shutdown the in-tree module hands
    it is never taken). With the package, exo's worker started a guardian, and that
    guardian ends the orphan from outside: SIGINT, then, as the runner cannot take
    it, SIGKILL once the busy wait is out (step `busy_wait`).

    Here the guardian is still running when exo dies because it watches the test
    session's decoy exo: on its own it leaves about 4 s after exo's worker started
    it, as exo's process, its parent, is among the ancestors it never watches (see
    docs/exo-evidence.md). Whatever it did, nothing the round started outlives it."""
    tree, venv = exo_for(exo_work, "main", config, exo_tree, exo_venv, exo_venv_cache)
    done = run_round(
        tree,
        venv,
        "main",
        config=config,
        scenario="app",
        busy="gil",
        busy_wait=WEDGED_BUSY_WAIT,
        observe=OBSERVE,
    )
    print(f"\n{done.line()}")
    assert [name for name, _ in done.signals] == ["SIGINT", "SIGTERM", "SIGKILL"], done
    assert done.exo_exit == -9, done
    assert done.package_seen == (config == "on-package"), done
    assert done.guardian_started == (config == "on-package"), done
    idle, wedged = done.runners["idle"], done.runners["busy"]
    assert idle.by == "exo", done
    if config == "on-package":
        assert (wedged.by, wedged.step) == ("guardian", "busy_wait"), done
        assert wedged.how.startswith("killed"), done
    else:
        assert wedged.by == "orphaned", done
    assert done.left_behind == [], done
