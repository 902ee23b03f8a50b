"""What ends exo's REAL runner, guarded by the series' hooks module alone (no package
code in the runner), when its worker is SIGKILLed, by what it is doing
(`exo_support/steps_site` puts it there, at the place it takes its next task):

| doing | what ends it |
|---|---|
| idle | exo's own Shutdown, handed to it on its task stream |
| decoding (exo main's own decode loop) | the Shutdown, taken between two steps |
| inside one long `mx.eval`, then back to its loop | the Shutdown, once the eval returns |
| loading, between layers (tasks not looked at) | nothing inside exo: left to the guardian |
| holding the GIL in a call that never returns | nothing inside exo: left to the guardian |

The figures print with `-s` (docs/exo-evidence.md has them). Needs EXO_SRC and MLX_LM_SRC,
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

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system.identity import identity_of
from tests.helpers.exo_trees import COMMITS, SUPPORT, exo_tree, exo_venv, exo_worker

pytestmark = [
    pytest.mark.exo,
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
]

Doing = Literal["idle", "decode", "load", "eval", "gil"]
ENDS_BY_ITSELF: dict[Doing, bool] = {
    "idle": True,
    "decode": True,
    "load": False,
    "eval": True,
    "gil": False,
}
EVAL_SECONDS = 4.0
LEFT_FOR = 6.0
"""How long a runner that never looks at its tasks is seen to live on after the kill."""


def _cases() -> list[tuple[str, Doing]]:
    # exo main's decode loop is the one this drives (`Runner.handle_generation_tasks`).
    return [
        (version, doing)
        for version in COMMITS
        for doing in ENDS_BY_ITSELF
        if doing != "decode" or version == "main"
    ]


@pytest.mark.parametrize(("version", "doing"), _cases())
def test_what_ends_exos_real_runner(
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
        "EOG_STEPS_GIL_AFTER_GO": "1",
    }
    with exo_worker(tree, venv, version, guard=True, extra_env=extra) as report:
        runner = identity_of(report["runner_pid"])
        assert runner is not None
        path = notes / f"{runner.pid}.jsonl"
        (notes / f"{runner.pid}.go").touch()  # the worker saw it idle: `gil` may begin
        deadline = time.monotonic() + 120.0
        while doing != "idle" and not (path.exists() and path.read_text()):
            assert time.monotonic() < deadline, f"exo's runner never began: {doing}"
            time.sleep(0.05)
        time.sleep(0.5)
        killed_at = time.monotonic()
        os.kill(report["worker_pid"], signal.SIGKILL)  # the worker's pid alone
        wait = EVAL_SECONDS + 5.0 if ENDS_BY_ITSELF[doing] else LEFT_FOR
        gone = scenarios.wait_gone([runner], wait)[runner]
        noted = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
        after = None if gone is None else gone - killed_at
        print(f"\nexo {version} {doing}: gone {after} s after the kill")
    if not ENDS_BY_ITSELF[doing]:
        assert gone is None, "something inside exo ended a runner that never looks"
        return
    assert gone is not None and after is not None, "exo's runner outlived its worker"
    match doing:
        case "idle" | "decode":
            assert after < 2.0, after
        case _:
            returned = [n["at"] for n in noted if n["event"] == "eval returned"]
            assert returned, noted  # it came back from its eval, then took the Shutdown
            assert gone - returned[0] < 2.0, (gone, returned)
