"""Never a wrong kill (issue 40 items 1, 2 and 4): programs that look like exo and are
not, planted beside real orphans of exo's stand-in so that each check is seen to run.

- A script whose ProcessPoolExecutor (spawn, as on macOS) runs from exo's own
  environment and crashes: its workers are spawn children of a dead parent, run by an
  interpreter whose environment has exo installed, and nothing in them shows exo. The
  default `sweep`, `scan` and the guardian's start-up sweep list them as orphaned, not
  known to be exo, and leave them; only an explicit `sweep --match` ends them. In the
  fake environment of the stand-ins, and in exo's real one (`scripts/exo-venv`).
- A container's init (`sh` as pid 1) holding the stdout that a v1.0.71 runner
  inherited: a shared pipe is no proof that it spawned the runner, so the orphaned
  runner is ended, while the crashed pool's workers beside it are left.
- A runner of `python -m exo`, which shows nothing of exo's: what the guardian saw of
  it under its live exo outlives a SIGKILL of the guardian, and its successor's
  start-up sweep ends it by that sighting.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.stand_in_exo import STARTED_AS_ENV
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from tests.helpers.cli import CLI, report_of, run_cli
from tests.helpers.exo_trees import exo_tree, exo_venv
from tests.helpers.guardian import guardian
from tests.helpers.lookalikes import POOL_SCRIPT, crash_a_pool, write_exo_main
from tests.helpers.processes import kill_all, make_fake_exo_environment
from tests.helpers.sweeps import gone, orphaned_runners
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.machine_wide


def _not_known(report: dict[str, Any]) -> set[int]:
    return {entry["pid"] for entry in report["spared"] if entry["not_known_exo"]}


def _suspects(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {suspect["pid"]: suspect for suspect in report["suspects"]}


def _stand_in_orphan(python: str) -> list[ProcessIdentity]:
    """A real exo orphan beside the look-alikes: the stand-in worker (it and its
    runner show exo, as exo's console script and its runners do), SIGKILLed."""
    worker = scenarios.start_worker(["idle"], watch="none", python=python)
    return orphaned_runners(worker)


def _survive_every_default_ending(
    lookalike_python: str, exo_python: str, directory: Path, registry: Path
) -> None:
    crashed = crash_a_pool(lookalike_python, directory)
    workers = list(crashed.children)
    control: list[ProcessIdentity] = []
    try:
        control += _stand_in_orphan(exo_python)
        scanned = report_of(run_cli("scan", "--json"))
        assert {worker.pid for worker in workers} <= _not_known(scanned), scanned
        assert not {worker.pid for worker in workers} & set(_suspects(scanned))
        assert control[0].pid in _suspects(scanned), "the stand-in's orphan is exo's"
        table = run_cli("scan").stdout
        assert all(f"NOT KNOWN {worker.pid} " in table for worker in workers), table

        swept = report_of(run_cli("sweep", "--json", "--grace", "0.5"))
        assert control[0].pid in _suspects(swept) and gone(control)
        assert {worker.pid for worker in workers} <= _not_known(swept)
        assert scenarios.alive(workers) == workers

        control += _stand_in_orphan(exo_python)
        with guardian(registry) as running:
            # Its start-up sweep and its first scan judge alike: whichever claims it.
            running.wait_for(rf"(start-up sweep|by a scan): runner {control[-1].pid} ended")
        assert scenarios.alive(workers) == workers

        # What ends them: an explicit --match (their interpreter's path, here).
        ended = report_of(run_cli("sweep", "--json", "--match", re.escape(lookalike_python)))
        assert {worker.pid for worker in workers} <= set(_suspects(ended))
        assert {_suspects(ended)[worker.pid]["rule"] for worker in workers} == {"match"}
        assert gone(workers)
    finally:
        kill_all([*crashed.left, *control])


def test_a_crashed_pool_run_by_exos_stand_in_environment_is_never_ended_by_default(
    tmp_path: Path, exo_python: str, isolated_environment: Path
) -> None:
    lookalike = make_fake_exo_environment(tmp_path / "exo-env")
    _survive_every_default_ending(lookalike, exo_python, tmp_path, isolated_environment)


@pytest.mark.exo
@pytest.mark.skipif(sys.platform != "linux", reason="exo's venvs are built for Linux here")
def test_a_crashed_pool_run_by_exos_real_venv_is_never_ended_by_default(
    tmp_path: Path,
    exo_python: str,
    isolated_environment: Path,
    exo_work: Path,
    exo_venv_cache: Path,
) -> None:
    venv = exo_venv(exo_tree(exo_work, "main", patched=False), exo_venv_cache, runner=True)
    python = str(venv / "bin" / "python")
    _survive_every_default_ending(python, exo_python, tmp_path, isolated_environment)


def test_a_python_dash_m_runner_is_ended_by_what_a_killed_guardian_saw(
    exo_python: str, isolated_environment: Path
) -> None:
    worker = scenarios.start_worker(
        ["idle"], watch="none", python=exo_python, extra_env={STARTED_AS_ENV: "module"}
    )
    runners = [runner.identity for runner in worker.runners]
    try:
        with guardian(isolated_environment) as first:
            first.watching(worker.pid)  # what it saw is written before it says so
            os.kill(first.pid, signal.SIGKILL)
        scenarios.kill_worker(worker)
        assert scenarios.alive(runners) == runners
        scanned = report_of(run_cli("scan", "--json"))
        suspect = _suspects(scanned)[runners[0].pid]
        assert f"runner of exo {worker.pid} (seen alive by the guardian)" in suspect["reason"]
        with guardian(isolated_environment) as second:
            # Its start-up sweep and its first scan judge alike: whichever claims it.
            ending = rf"(start-up sweep|orphans found by a scan): runner {runners[0].pid} ended"
            second.wait_for(ending)
        assert gone(runners)
    finally:
        scenarios.cleanup(worker)


# --- a container's init sharing a pipe with the runner ------------------------------


@pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or shutil.which("nsenter") is None,
    reason="a pid namespace of its own needs Linux, root, unshare and nsenter",
)
def test_an_init_sharing_the_runners_stdout_does_not_keep_it_and_spares_the_lookalike(
    tmp_path: Path, isolated_environment: Path
) -> None:
    """`sh` as the pid 1 of a pid namespace, holding the stdout (a pipe) that a v1.0.71
    runner and a crashed pool's workers inherited. The runner shows exo (the runner of
    exo's console script); the pool's workers, from the same environment, show nothing
    of exo's."""
    python = make_fake_exo_environment(tmp_path / "exo-env")
    console, _ = write_exo_main(python)
    pool_script = tmp_path / "pool.py"
    pool_script.write_text(POOL_SCRIPT)
    namespace = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--"]
    script = '"$0" & "$1" "$2" & while :; do sleep 1; done'
    init = subprocess.Popen(
        [*namespace, "sh", "-c", script, console, python, str(pool_script)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert init.stdout is not None
        reported = [init.stdout.readline() for _ in range(2)]  # the runner's, the pool's
        sh = _only_child(init.pid)
        parents = [_child_running(sh, path) for path in (console, str(pool_script))]
        runner, workers = (_spawn_children(parent.pid) for parent in parents)
        assert runner and workers, reported
        for parent in parents:
            os.kill(parent.pid, signal.SIGKILL)
        assert all(seen is not None for seen in scenarios.wait_gone(parents, 10.0).values())
        # A dead leader shows as a zombie while its other threads still exit; its children
        # pass to `sh` only once the last one has.
        assert wait_until(
            lambda: all(system.parent_pid(child.pid) == sh for child in (*runner, *workers)),
            10.0,
        )

        scanned = report_of(_cli_inside(sh, "scan", "--json"))
        # Inside the namespace, the runner's parent is pid 1: `sh`, holding its stdout.
        assert [suspect["ppid"] for suspect in scanned["suspects"]] == [1], scanned
        assert "not a Python program" in scanned["suspects"][0]["reason"]
        assert len(_not_known(scanned)) == len(workers)
        swept = report_of(_cli_inside(sh, "sweep", "--json", "--grace", "0.5"))
        assert len(swept["suspects"]) == 1 and len(_not_known(swept)) == len(workers)
        assert gone(runner)
        assert scenarios.alive(workers) == workers
    finally:
        init.kill()
        init.wait()


def _cli_inside(init: int, *words: str) -> subprocess.CompletedProcess[str]:
    """The CLI run inside the pid namespace whose init is `init` (and its /proc)."""
    inside = ["nsenter", "--target", str(init), "--pid", "--mount", "--"]
    return subprocess.run(
        [*inside, *CLI, *words], capture_output=True, text=True, timeout=60, check=False
    )


def _only_child(pid: int) -> int:
    (child,) = system.child_pids(pid)
    return child


def _child_running(parent: int, script: str) -> ProcessIdentity:
    for child in system.child_pids(parent):
        read = system.exe_and_argv(child)
        if read is not None and script in read[1] and (identity := identity_of(child)):
            return identity
    raise AssertionError(f"nothing under {parent} runs {script}")


def _spawn_children(parent: int) -> list[ProcessIdentity]:
    found: list[ProcessIdentity] = []
    for child in system.child_pids(parent):
        read = system.exe_and_argv(child)
        if read is not None and "--multiprocessing-fork" in read[1]:
            identity = identity_of(child)
            assert identity is not None
            found.append(identity)
    return found
