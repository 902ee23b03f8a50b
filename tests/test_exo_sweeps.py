"""The sweeps against real exo, at the five versions: the default sweep finds the
orphan of unpatched exo; a guarded runner sweeps the orphans of dead workers before
its loop takes a task (its group's ConnectToGroup among them), so only that runner
waits, never the worker's plan loop (issue 28 item 1).

The seven-patch series' worker-side hooks (ConnectToGroup swept in `Worker.plan_step`,
a runner failure diagnosed in the supervisor) are gone from exo's tree, and their
checks with them: the sweep lives in the runner's call, where no deferred task can
race it. Needs EXO_SRC and MLX_LM_SRC, as `test_exo_integration.py`."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system.identity import identity_of
from tests.helpers.exo_trees import exo_tree, exo_venv, exo_worker
from tests.helpers.exo_trees import versions as exo_versions

pytestmark = [pytest.mark.exo, pytest.mark.skipif(sys.platform != "linux", reason="Linux only")]
all_versions = exo_versions()


@all_versions
@pytest.mark.machine_wide
def test_the_default_sweep_finds_and_kills_the_orphan_of_unpatched_exo(
    version: str, exo_work: Path, exo_venv_cache: Path, tmp_path: Path
) -> None:
    tree = exo_tree(exo_work, version, patched=False)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    with exo_worker(tree, venv, version, guard=False) as report:
        runner = identity_of(report["runner_pid"])
        assert runner is not None
        trackers = [
            identity
            for child in psutil.Process(report["worker_pid"]).children()
            if "resource_tracker" in " ".join(child.cmdline())
            for identity in [identity_of(child.pid)]
            if identity is not None
        ]
        os.kill(report["worker_pid"], signal.SIGKILL)
        time.sleep(1.0)
        assert scenarios.alive([runner]) == [runner], "unpatched exo should leave an orphan"
        swept = sweep(registry_dir=tmp_path / "registry", grace=1.0)
        ours = [verdict for verdict in swept.targets if verdict.pid == runner.pid]
        assert [verdict.rule for verdict in ours] == ["fingerprint"], swept.verdicts
        assert scenarios.wait_gone([runner], 3.0)[runner] is not None
        # multiprocessing's resource tracker is no runner: it leaves by itself.
        assert trackers and all(
            seen is not None for seen in scenarios.wait_gone(trackers, 5.0).values()
        )
        assert all(killed.target not in trackers for killed in swept.results)
