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

import pytest

from exo_orphan_guard.exo import footprints
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system.identity import identity_of
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


SERIES_TESTS = [footprints.WATCH_TEST, footprints.SWEEP_TEST]
"""exo tests the PR adds where exo's runner has its own task queue (main): left out
where results are compared, run on their own with the toggle on and off."""


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
    # The PR's tests drive exo main's runner and worker; the relay's trees get none.
    assert bool(added_tests) == (version == "main"), added_tests
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


@versions
def test_exos_real_runner_busy_in_long_mlx_evals_is_not_interrupted_from_inside(
    version: str, exo_work: Path, exo_venv_cache: Path, tmp_path: Path
) -> None:
    """exo's real runner inside `mx.eval`s of seconds (`exo_support/busy_site`: where
    exo would run a task, as a prefill chunk would, never back to its loop) when its
    worker is SIGKILLed: the series' module only hands it its Shutdown, which its loop
    never takes, and nothing inside exo interrupts or kills it (the guardian does,
    from outside). Its evals go on, and its logging through exo's own
    `logger_setup` sinks (read by the dead worker) does not stop it."""
    tree = exo_tree(exo_work, version, patched=True)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    notes = tmp_path / "notes"
    notes.mkdir()
    extra = {"PYTHONPATH": str(SUPPORT / "busy_site"), "EOG_BUSY_EVAL_NOTES": str(notes)}
    with exo_worker(tree, venv, version, guard=True, extra_env=extra) as report:
        runner = identity_of(report["runner_pid"])
        assert runner is not None
        path = notes / f"{runner.pid}.jsonl"
        deadline = time.monotonic() + 120.0
        while not (path.exists() and path.read_text()):
            assert time.monotonic() < deadline, "exo's runner never began a long eval"
            time.sleep(0.05)
        os.kill(report["worker_pid"], signal.SIGKILL)  # the worker's pid alone
        killed_at = time.monotonic()
        assert scenarios.wait_gone([runner], 8.0)[runner] is None
        evals = [json.loads(line) for line in path.read_text().splitlines()]
        begun_after = [n for n in evals if n["event"] == "eval begun" and n["at"] > killed_at]
        assert begun_after, "its evals stopped when its worker died"
