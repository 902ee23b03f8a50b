"""Which step ends exo's REAL runner when its worker is SIGKILLed, by what it is doing
(`exo_support/steps_site` puts it there, at the place it takes its next task):

| doing | what ends it |
|---|---|
| idle | exo's own Shutdown, handed to it on its task stream |
| decoding (exo main's own decode loop) | the Shutdown, taken between two steps |
| loading, between layers (tasks not looked at) | `WorkerGone`, once the window has passed |
| inside one long `mx.eval`, then back to its loop | the Shutdown, once the eval returns |
| holding the GIL in a call that never returns | the kill, at the busy wait |

The figures print with `-s` (docs/exo.md has them). Needs EXO_SRC and MLX_LM_SRC,
as `make test-exo`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Literal

import pytest

from exo_orphan_guard.records import endings
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import identity_of
from exo_orphan_guard.watch.handover import HANDOVER_SECONDS
from tests.helpers.exo_trees import COMMITS, SUPPORT, exo_tree, exo_venv, exo_worker
from tests.test_exo_integration import ending_of

# A guarded exo runner sweeps the machine before its first task: confined only.
pytestmark = [
    pytest.mark.exo,
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
]

Doing = Literal["idle", "decode", "load", "eval", "gil"]
EXPECTED: dict[Doing, tuple[endings.How, endings.Step]] = {
    "idle": ("clean", "shutdown"),
    "decode": ("clean", "shutdown"),
    "load": ("clean", "worker_gone"),
    "eval": ("clean", "shutdown"),
    "gil": ("killed", "busy_wait"),
}
GRACE = 10.0
BUSY_WAIT = 8.0
EVAL_SECONDS = HANDOVER_SECONDS + 2.0
"""Longer than the window: it opens only once the eval is back in Python."""


def _cases() -> list[tuple[str, Doing]]:
    # exo main's decode loop is the one this drives (`Runner.handle_generation_tasks`).
    return [
        (version, doing)
        for version in COMMITS
        for doing in EXPECTED
        if doing != "decode" or version == "main"
    ]


@pytest.mark.parametrize(("version", "doing"), _cases())
def test_which_step_ends_exos_real_runner(
    version: str, doing: Doing, exo_work: Path, exo_venv_cache: Path, tmp_path: Path
) -> None:
    tree = exo_tree(exo_work, version, patched=True)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    notes = tmp_path / "notes"
    notes.mkdir()
    extra = {
        "PYTHONPATH": str(SUPPORT / "steps_site"),
        "EOG_STEPS_MODE": doing,
        "EOG_STEPS_NOTES": str(notes),
        "EOG_STEPS_EVAL_SECONDS": str(EVAL_SECONDS),
        settings.BUSY_WAIT_ENV: str(BUSY_WAIT),
    }
    with exo_worker(tree, venv, version, guard=True, grace=GRACE, extra_env=extra) as report:
        runner = identity_of(report["runner_pid"])
        assert runner is not None
        path = notes / f"{runner.pid}.jsonl"
        deadline = time.monotonic() + 120.0
        while doing != "idle" and not (path.exists() and path.read_text()):
            assert time.monotonic() < deadline, f"exo's runner never began: {doing}"
            time.sleep(0.05)
        time.sleep(0.5)
        killed_at = time.monotonic()
        os.kill(report["worker_pid"], signal.SIGKILL)  # the worker's pid alone
        gone = scenarios.wait_gone([runner], BUSY_WAIT + GRACE + 5.0)[runner]
        assert gone is not None, "exo's runner outlived its worker and every bound"
        ending = ending_of(report["registry"], runner)
        noted = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
        after = gone - killed_at
        print(f"\nexo {version} {doing}: gone {after:.3f} s after the kill: {ending}")
    assert ending is not None
    assert (ending.how, ending.step) == EXPECTED[doing], ending
    match doing:
        case "idle" | "decode":
            assert after < 2.0, after
        case "load":
            assert HANDOVER_SECONDS <= after < HANDOVER_SECONDS + 3.0, after
        case "eval":
            returned = [n["at"] for n in noted if n["event"] == "eval returned"]
            assert returned, noted  # it came back from its eval, then took the Shutdown
            assert gone - returned[0] < 2.0, (gone, returned)
        case "gil":
            assert BUSY_WAIT <= after < BUSY_WAIT + 2.0, after
