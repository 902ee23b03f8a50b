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
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
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


@all_versions
@pytest.mark.machine_wide
def test_a_guarded_runner_sweeps_the_orphans_of_dead_workers_before_its_first_task(
    version: str, exo_work: Path, exo_venv_cache: Path
) -> None:
    """An orphan of a dead exo (exo's venv python, a spawn child whose parent has
    exited) is gone by the time exo's real guarded runner reports RunnerIdle: the
    runner's guard swept it first, with the runner's registry recording the kill."""
    tree = exo_tree(exo_work, version, patched=True)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    started = subprocess.run(
        [
            "sh",
            "-c",
            '"$0" -c "import time; time.sleep(600)" --multiprocessing-fork '
            "</dev/null >/dev/null 2>&1 & echo $!",
            str(venv / "bin" / "python"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    orphan = identity_of(int(started.stdout.split()[0]))
    assert orphan is not None and scenarios.alive([orphan]) == [orphan]
    try:
        with exo_worker(tree, venv, version, guard=True) as report:
            runner = identity_of(report["runner_pid"])
            assert runner is not None
            gone = scenarios.wait_gone([orphan], 5.0)[orphan]
            assert gone is not None, "the guarded runner did not sweep the orphan"
            assert scenarios.alive([runner]) == [runner], "the sweep took the runner itself"
            path = host_directory(report["registry"]) / endings.ENDINGS_NAME
            ended = endings.latest(endings.read(path, system.boot_id())).get(orphan)
            assert ended is not None and ended.by == "sweep", ended
    finally:
        if scenarios.alive([orphan]):
            os.kill(orphan.pid, signal.SIGKILL)
