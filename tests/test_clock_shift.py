"""Identity that no clock moves: one process's psutil sees the boot time 1 s off.

psutil's `create_time()` adds a boot time read in the calling process (macOS: the
change in `kern.boottime` since that process imported psutil), so two processes can
disagree about one pid's start. Worker, runners, watchdogs and sweeps must not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import sweep
from tests.conftest import StartWorker

SHIFT_HOOK = Path(__file__).parent / "helpers" / "boot_shift"
Role = Literal["worker", "runner"]


def shifted_environment(role: Role) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {
        "EOG_TEST_BOOT_SHIFT": role,
        "PYTHONPATH": os.pathsep.join(part for part in (str(SHIFT_HOOK), path) if part),
    }


def test_the_hook_really_moves_create_time_in_that_process_only() -> None:
    """Otherwise the tests below would prove nothing."""
    probe = "import os, psutil; print(repr(psutil.Process(os.getppid()).create_time()))"
    readings: list[float] = []
    for role in ("other", "runner"):
        env = {**os.environ, **shifted_environment("runner")}
        argv = [sys.executable, "-c", probe] + (
            ["--multiprocessing-fork"] if role == "runner" else []
        )
        completed = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        readings.append(float(completed.stdout))
    assert readings[1] - readings[0] == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("role", ["worker", "runner"])
def test_a_shifted_boot_time_neither_kills_runners_nor_loses_their_records(
    start_worker: StartWorker, isolated_environment: Path, role: Role
) -> None:
    worker = start_worker(["idle", "gil"], extra_env=shifted_environment(role))
    everyone = worker.all_processes()
    time.sleep(1.0)
    # The runners did not take their live worker for dead (nor the worker for reused).
    assert scenarios.alive(everyone) == everyone, role
    records = sorted(isolated_environment.rglob("runner-*.json"))
    assert len(records) == 2
    # A sweep in a process whose psutil is not shifted sees live runners of a live
    # worker: it kills nothing and forgets no record.
    report = sweep(fingerprint=False, grace=0.2)
    ours = {runner.identity.pid for runner in worker.runners}
    verdicts = {verdict.pid: verdict.action for verdict in report.verdicts if verdict.pid in ours}
    assert verdicts == dict.fromkeys(ours, "spare"), report.verdicts
    assert sorted(isolated_environment.rglob("runner-*.json")) == records
    assert scenarios.alive(everyone) == everyone
    # And the watch still works: the worker's death ends them all.
    scenarios.kill_worker(worker)
    exits = scenarios.wait_gone(everyone, 5.0)
    assert all(seen is not None for seen in exits.values()), exits
