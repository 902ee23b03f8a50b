"""The patches against real exo, in exo's runner: exo's own tests give the same
results patched, on and off; exo's real runner dies with its worker only when guarded,
running exo's own shutdown first, and waits out a long `mx.eval` before it does. The
worker's side (its sweeps through exo's real Worker and supervisor) is in
`test_exo_sweeps.py`.

Needs an exo checkout (a git clone of exo-explore/exo) in EXO_SRC, and for the runner
tests the mlx-lm fork exo pins (github rltakashige/mlx-lm) in MLX_LM_SRC:

    make test-exo EXO_SRC=/path/to/exo MLX_LM_SRC=/path/to/mlx-lm

Each test works on throw-away copies of exo (`tests/helpers/exo_trees.py`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from tests.helpers.exo_trees import (
    SUPPORT,
    exo_environment,
    exo_tree,
    exo_venv,
    exo_worker,
)
from tests.helpers.exo_trees import versions as exo_versions

# A guarded exo runner sweeps the machine before its first task (and exo's own tests
# start one): only inside scripts/confined's pid namespace.
pytestmark = [
    pytest.mark.exo,
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
]
versions = exo_versions()

SUPERVISOR_AND_PLAN = [
    "src/exo/worker/tests/unittests/test_runner/test_runner_supervisor.py",
    "src/exo/worker/tests/unittests/test_plan/",
]
EXO_OWN_TESTS = {
    "v1.0.61": SUPERVISOR_AND_PLAN,  # no test_mp_channel.py yet
    "v1.0.65": [*SUPERVISOR_AND_PLAN, "src/exo/utils/tests/test_mp_channel.py"],
    "v1.0.69": [*SUPERVISOR_AND_PLAN, "src/exo/utils/tests/test_mp_channel.py"],
    "main": [
        "src/exo/worker/tests/unittests/test_runner/test_runner_supervisor.py",
        "src/exo/worker/tests/unittests/test_plan/",
        "src/exo/utils/tests/test_async_process.py",
    ],
    "v1.0.71": [
        "src/exo/worker/tests/unittests/test_runner/test_runner_supervisor.py",
        "src/exo/worker/tests/unittests/test_plan/",
        "src/exo/utils/tests/test_mp_channel.py",
    ],
}


SERIES_TESTS = ["src/exo/worker/tests/unittests/test_orphan_guard.py"]
"""exo tests the series adds (the hooks' own): left out where results are compared,
run on their own with the toggle on and off."""


def run_exo_tests(
    tree: Path, venv: Path, version: str, *, guard: bool, tests: list[str] | None = None
) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="eog-exo-tests-") as scratch:
        completed = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                *(tests or [*EXO_OWN_TESTS[version], *(f"--ignore={t}" for t in SERIES_TESTS)]),
            ],
            cwd=tree,
            env=exo_environment(Path(scratch), guard=guard),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    summary = completed.stdout.strip().splitlines()[-1] if completed.stdout.strip() else ""
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (\w+)", summary)}
    assert counts.get("passed", 0) > 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    return counts


@versions
def test_exos_own_tests_give_the_same_results_patched_on_and_off(
    version: str, exo_work: Path, exo_venv_cache: Path
) -> None:
    """In the runner's environment (mlx and mlx-lm as each version pins): from v1.0.69
    on, `bootstrap.py` imports mlx at the top, so the supervisor's tests need it."""
    pristine = exo_tree(exo_work, version, patched=False)
    patched = exo_tree(exo_work, version, patched=True)
    pristine_venv = exo_venv(pristine, exo_venv_cache, runner=True)
    baseline = run_exo_tests(pristine, pristine_venv, version, guard=False)
    patched_venv = exo_venv(patched, exo_venv_cache, runner=True)
    off = run_exo_tests(patched, patched_venv, version, guard=False)
    on = run_exo_tests(patched, patched_venv, version, guard=True)
    print(f"\nexo {version}'s own tests: {baseline}")
    assert baseline == off == on, (baseline, off, on)
    assert "failed" not in baseline and "error" not in baseline
    added_tests = [test for test in SERIES_TESTS if (patched / test).exists()]
    assert added_tests, "the series adds no tests of its own to exo"
    for guard in (False, True):
        if added_tests:
            added = run_exo_tests(patched, patched_venv, version, guard=guard, tests=added_tests)
            print(f"exo {version}, the series' tests, guard {guard}: {added}")
            assert "failed" not in added and "error" not in added, added


@versions
@pytest.mark.parametrize("guard", [True, False], ids=["guard-on", "guard-off"])
def test_exos_real_runner_dies_with_its_worker_only_when_guarded(
    version: str, guard: bool, exo_work: Path, exo_venv_cache: Path
) -> None:
    tree = exo_tree(exo_work, version, patched=True)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    with exo_worker(tree, venv, version, guard=guard) as report:
        runner = identity_of(report["runner_pid"])
        assert runner is not None
        os.kill(report["worker_pid"], signal.SIGKILL)  # the worker's pid alone
        # Guarded, it runs exo's own shutdown first (see the next test), then exits.
        exits = scenarios.wait_gone([runner], CLEAN_ENDING_BOUND if guard else 1.0)
        assert (exits[runner] is not None) == guard, exits


CLEAN_ENDING_BOUND = 5.0
"""exo's runner ends in well under this (its shutdown, its task reader, its exit);
the grace it is given is twice as long."""


def step_of(ending: endings.Ending) -> str | None:
    """Which step ended the runner, where the record says (the new footprint's
    endings do; the stored series' do not)."""
    step: object = getattr(ending, "step", None)
    return step if isinstance(step, str) else None


def ended_the_clean_way(ending: endings.Ending, *, busy: bool = False) -> bool:
    """Whether the runner ended by itself, not killed. An idle runner: through exo's
    own shutdown, by the `Shutdown` posted on its task stream, which exo's loop took
    (the new footprint: step `shutdown`), or by `WorkerGone` running exo's
    `Runner.shutdown` (the stored series' patch 0007: step `worker_gone`, "it ran its
    own shutdown"). A busy one may also end at `WorkerGone` with the new footprint:
    busy_site's evals never go back to exo's loop, so the Shutdown is never taken,
    and `WorkerGone` is raised once an eval returns to Python."""
    if ending.how != "clean":
        return False
    step = step_of(ending)
    return (
        step == "shutdown" or "its own shutdown" in ending.why or (busy and step == "worker_gone")
    )


def ending_of(registry: Path, runner: ProcessIdentity) -> endings.Ending | None:
    path = host_directory(registry) / endings.ENDINGS_NAME
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        found = endings.latest(endings.read(path, system.boot_id())).get(runner)
        if found is not None and found.event == "ended":
            return found
        time.sleep(0.05)
    return None


@versions
@pytest.mark.parametrize("grace", [2 * CLEAN_ENDING_BOUND, 0.0], ids=["clean", "grace-0"])
def test_exos_real_runner_runs_its_own_shutdown_when_its_worker_dies(
    version: str, grace: float, exo_work: Path, exo_venv_cache: Path
) -> None:
    """With a grace, the worker's SIGKILL runs exo's Runner.shutdown in the runner,
    which then exits by itself; with grace 0 it is killed at once (the control)."""
    tree = exo_tree(exo_work, version, patched=True)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    with exo_worker(tree, venv, version, guard=True, grace=grace) as report:
        runner = identity_of(report["runner_pid"])
        assert runner is not None
        killed_at = time.monotonic()
        os.kill(report["worker_pid"], signal.SIGKILL)  # the worker's pid alone
        gone = scenarios.wait_gone([runner], grace + 2.0)[runner]
        assert gone is not None, "exo's runner outlived its worker and the grace"
        ending = ending_of(report["registry"], runner)
        assert ending is not None, "no ending recorded"
        print(f"\nexo {version}, grace {grace:g}: gone {gone - killed_at:.3f} s, {ending}")
        if grace:
            assert gone - killed_at < CLEAN_ENDING_BOUND, gone - killed_at
            assert ended_the_clean_way(ending), ending
        else:
            assert gone - killed_at < 1.0, gone - killed_at
            assert ending.how == "killed", ending
            assert step_of(ending) in (None, "at_once", "grace"), ending
            assert step_of(ending) is not None or settings.GRACE_ENV in ending.why, ending


@versions
def test_exos_real_runner_busy_in_long_mlx_evals_ends_by_itself_once_one_returns(
    version: str, exo_work: Path, exo_venv_cache: Path, tmp_path: Path
) -> None:
    """exo's real runner inside one `mx.eval` of seconds (`exo_support/busy_site`: where
    exo would run a task, as a prefill chunk would) when its worker is SIGKILLed: it
    is waited for, and once the eval returns it logs 1.5 MiB through exo's own
    `logger_setup` sinks (read by the dead worker) and ends by itself: with the stored
    series `WorkerGone` runs exo's own `Runner.shutdown`; with the new footprint it
    leaves through exo's code (step `worker_gone`), its loop never having come back
    for the Shutdown. Before the busy wait it was killed 0.5 s after the notice."""
    tree = exo_tree(exo_work, version, patched=True)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    notes = tmp_path / "notes"
    notes.mkdir()
    extra = {
        "PYTHONPATH": str(SUPPORT / "busy_site"),
        "EOG_BUSY_EVAL_NOTES": str(notes),
        "EOG_BUSY_LOG_FLOOD": str(3 * 2**19),  # 1.5 MiB through exo's own logger_setup
        settings.BUSY_WAIT_ENV: "60",
    }
    grace = 2 * CLEAN_ENDING_BOUND
    with exo_worker(tree, venv, version, guard=True, grace=grace, extra_env=extra) as report:
        runner = identity_of(report["runner_pid"])
        assert runner is not None
        path = notes / f"{runner.pid}.jsonl"
        deadline = time.monotonic() + 120.0
        begun: dict[str, Any] | None = None
        while begun is None:
            assert time.monotonic() < deadline, "exo's runner never began a long eval"
            lines = path.read_text().splitlines() if path.exists() else []
            sized = [json.loads(line) for line in lines]
            sized = [n for n in sized if n["event"] == "eval begun" and n["last"] >= 2.5]
            begun = sized[-1] if sized else None
            time.sleep(0.05)
        time.sleep(0.2)
        killed_at = time.monotonic()
        os.kill(report["worker_pid"], signal.SIGKILL)  # the worker's pid alone
        gone = scenarios.wait_gone([runner], 60.0 + grace)[runner]
        assert gone is not None, "exo's runner outlived its worker, the busy wait and the grace"
        ending = ending_of(report["registry"], runner)
        print(f"\nexo {version} busy: gone {gone - killed_at:.3f} s after the kill, {ending}")
        assert gone - begun["at"] >= 2.0, "it was not waited for until its eval returned"
        assert ending is not None and ended_the_clean_way(ending, busy=True), ending
        logged = [json.loads(line) for line in path.read_text().splitlines()]
        assert [n["bytes"] for n in logged if n["event"] == "logged"] == [3 * 2**19], logged
