"""The patches against real exo: exo's own tests, exo's real runner, exo's real Worker.

Needs an exo checkout (a git clone of exo-explore/exo) in EXO_SRC, and for the runner
test the mlx-lm fork exo pins (github rltakashige/mlx-lm) in MLX_LM_SRC:

    make test-exo EXO_SRC=/path/to/exo MLX_LM_SRC=/path/to/mlx-lm

Each test works on throw-away copies of exo at the two supported commits, in Python
3.13 environments built by scripts/exo-venv (cached between runs).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.exo import patching
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from tests.helpers.processes import kill_all

REPO = Path(__file__).resolve().parents[1]
SUPPORT = REPO / "tests" / "exo_support"
COMMITS = {"v1.0.71": "fd707de30b42", "main": "b5375f8cee43"}
EXO_OWN_TESTS = {
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
HOW_TO_RUN = "run `make test-exo EXO_SRC=/path/to/exo MLX_LM_SRC=/path/to/mlx-lm`"

pytestmark = [pytest.mark.exo, pytest.mark.skipif(sys.platform != "linux", reason="Linux only")]
versions = pytest.mark.parametrize("version", list(COMMITS))


def exo_src() -> Path:
    value = os.environ.get("EXO_SRC", "").strip()
    if not value:
        pytest.skip(
            f"EXO_SRC is not set, so there is no exo checkout to test against: {HOW_TO_RUN}"
        )
    path = Path(value).expanduser()
    if not (path / ".git").exists() and not (path / "HEAD").exists():
        pytest.fail(f"EXO_SRC={value} is not a git clone of exo-explore/exo")
    return path


def mlx_lm_src() -> Path:
    value = os.environ.get("MLX_LM_SRC", "").strip()
    if not value:
        pytest.skip(f"MLX_LM_SRC is not set, so exo's runner cannot load: {HOW_TO_RUN}")
    return Path(value).expanduser()


@pytest.fixture(scope="session")
def venv_cache() -> Path:
    return Path(os.environ.get("EXO_VENV_CACHE", REPO / ".cache" / "exo-venv"))


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exo-trees")


def exo_tree(work: Path, version: str, *, patched: bool) -> Path:
    """A fresh copy of exo at `version`'s commit; with the series applied if asked."""
    source = exo_src()
    target = work / f"{version}-{'patched' if patched else 'pristine'}"
    if not target.exists():
        target.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(source), "archive", COMMITS[version]],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
        if patched:
            status, changed = patching.apply(target)
            assert changed and status.series.name == version
    return target


def exo_venv(tree: Path, cache: Path, *, runner: bool = False) -> Path:
    command = [str(REPO / "scripts" / "exo-venv"), str(tree), str(cache)]
    if runner:
        command += ["--runner", str(mlx_lm_src())]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.fail(f"scripts/exo-venv failed: {built.stderr.strip().splitlines()[-1:]}")
    venv = Path(built.stdout.strip().splitlines()[-1])
    # exo_orphan_guard from this checkout, and nothing else of it (no `tests` package
    # to shadow exo's); psutil, anyio and loguru are exo's own dependencies. One
    # directory per checkout: checkouts that share a cache must not share a link.
    key = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    path_dir = cache / "exo-orphan-guard-path" / key
    path_dir.mkdir(parents=True, exist_ok=True)
    link = path_dir / "exo_orphan_guard"
    if not link.is_symlink() or link.resolve() != (REPO / "exo_orphan_guard").resolve():
        link.unlink(missing_ok=True)
        link.symlink_to(REPO / "exo_orphan_guard")
    (site_packages,) = venv.glob("lib/python3.*/site-packages")
    (site_packages / "exo_orphan_guard_checkout.pth").write_text(f"{path_dir}\n")
    return venv


def exo_environment(scratch: Path, *, guard: bool) -> dict[str, str]:
    (scratch / "resources").mkdir(parents=True, exist_ok=True)
    (scratch / "dashboard").mkdir(exist_ok=True)
    (scratch / "dashboard" / "index.html").write_text("<!doctype html>\n")
    env = dict(os.environ)
    env.update(
        {
            "EXO_RESOURCES_DIR": str(scratch / "resources"),
            "EXO_DASHBOARD_DIR": str(scratch / "dashboard"),
            "XDG_CACHE_HOME": str(scratch / "xdg-cache"),
            "PYTHONDONTWRITEBYTECODE": "1",
            settings.TOGGLE_ENV: "1" if guard else "0",
            settings.DIR_ENV: str(scratch / "registry"),
        }
    )
    env.pop(settings.WORKER_ENV, None)
    # This checkout's package, whatever the shared venv cache's .pth names (another
    # checkout may have made it): PYTHONPATH comes first.
    path_dir = scratch / "guard-path"
    path_dir.mkdir(exist_ok=True)
    link = path_dir / "exo_orphan_guard"
    if not link.is_symlink():
        link.symlink_to(REPO / "exo_orphan_guard")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path_dir), env.get("PYTHONPATH")]))
    return env


SERIES_TESTS = ["src/exo/worker/tests/unittests/test_plan/test_connect_to_group.py"]
"""exo tests the series adds (patch 0003): left out where results are compared."""


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
    version: str, work: Path, venv_cache: Path
) -> None:
    pristine = exo_tree(work, version, patched=False)
    patched = exo_tree(work, version, patched=True)
    baseline = run_exo_tests(pristine, exo_venv(pristine, venv_cache), version, guard=False)
    patched_venv = exo_venv(patched, venv_cache)
    off = run_exo_tests(patched, patched_venv, version, guard=False)
    on = run_exo_tests(patched, patched_venv, version, guard=True)
    assert baseline == off == on, (baseline, off, on)
    assert "failed" not in baseline and "error" not in baseline
    for guard in (False, True):
        added = run_exo_tests(patched, patched_venv, version, guard=guard, tests=SERIES_TESTS)
        assert added == {"passed": 2}, added


@contextlib.contextmanager
def exo_worker(
    tree: Path,
    venv: Path,
    version: str,
    *,
    guard: bool,
    grace: float | None = None,
    extra_env: dict[str, str] | None = None,
) -> Generator[dict[str, Any]]:
    """exo's real RunnerSupervisor spawning exo's real entrypoint, runner idle. The
    report also names the registry the runner records itself (and its ending) in."""
    scratch = Path(tempfile.mkdtemp(prefix="eog-exo-worker-"))
    stderr = (scratch / "harness.log").open("wb")
    environment = exo_environment(scratch, guard=guard)
    if grace is not None:
        environment[settings.GRACE_ENV] = f"{grace!r}"
    for name, value in (extra_env or {}).items():
        joined = [value, environment.get(name, "")] if name == "PYTHONPATH" else [value]
        environment[name] = os.pathsep.join(filter(None, joined))
    harness = subprocess.Popen(
        [
            str(venv / "bin" / "python"),
            str(SUPPORT / "worker_harness.py"),
            "--version",
            version,
            "--scratch",
            str(scratch / "harness"),
        ],
        cwd=tree,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    spawned: list[int] = []
    try:
        assert harness.stdout is not None
        ready, _, _ = select.select([harness.stdout], [], [], 120)
        line = harness.stdout.readline() if ready else b""
        report: dict[str, Any] = json.loads(line or b"{}")
        assert report.get("event") == "runner-idle", (
            report,
            (scratch / "harness.log").read_text()[-3000:],
        )
        spawned.append(report["runner_pid"])
        yield {**report, "registry": scratch / "registry"}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
        stderr.close()
        kill_all([identity for pid in spawned if (identity := identity_of(pid)) is not None])
        shutil.rmtree(scratch, ignore_errors=True)


@versions
@pytest.mark.parametrize("guard", [True, False], ids=["guard-on", "guard-off"])
def test_exos_real_runner_dies_with_its_worker_only_when_guarded(
    version: str, guard: bool, work: Path, venv_cache: Path
) -> None:
    tree = exo_tree(work, version, patched=True)
    venv = exo_venv(tree, venv_cache, runner=True)
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
    version: str, grace: float, work: Path, venv_cache: Path
) -> None:
    """With a grace, the worker's SIGKILL runs exo's Runner.shutdown in the runner,
    which then exits by itself; with grace 0 it is killed at once (the control)."""
    tree = exo_tree(work, version, patched=True)
    venv = exo_venv(tree, venv_cache, runner=True)
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
            assert ending.how == "clean" and "its own shutdown" in ending.why, ending
        else:
            assert gone - killed_at < 1.0, gone - killed_at
            assert ending.how == "killed" and settings.GRACE_ENV in ending.why, ending


@versions
def test_exos_real_runner_busy_in_long_mlx_evals_runs_its_shutdown_once_one_returns(
    version: str, work: Path, venv_cache: Path, tmp_path: Path
) -> None:
    """exo's real runner inside one `mx.eval` of seconds (`exo_support/busy_site`: where
    exo would run a task, as a prefill chunk would) when its worker is SIGKILLed: it
    is waited for, and once the eval returns it logs 1.5 MiB through exo's own
    `logger_setup` sinks (read by the dead worker), runs exo's own `Runner.shutdown`
    and exits by itself. Before the busy wait it was killed 0.5 s after the notice."""
    tree = exo_tree(work, version, patched=True)
    venv = exo_venv(tree, venv_cache, runner=True)
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
        assert ending is not None and ending.how == "clean", ending
        assert "its own shutdown" in ending.why, ending
        logged = [json.loads(line) for line in path.read_text().splitlines()]
        assert [n["bytes"] for n in logged if n["event"] == "logged"] == [3 * 2**19], logged


@versions
@pytest.mark.machine_wide
def test_the_default_sweep_finds_and_kills_the_orphan_of_unpatched_exo(
    version: str, work: Path, venv_cache: Path, tmp_path: Path
) -> None:
    tree = exo_tree(work, version, patched=False)
    venv = exo_venv(tree, venv_cache, runner=True)
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


def run_check(
    script: str, version: str, work: Path, venv_cache: Path, *options: str
) -> dict[str, object]:
    """Run one of tests/exo_support's checks in a patched exo tree; its JSON verdict."""
    tree = exo_tree(work, version, patched=True)
    venv = exo_venv(tree, venv_cache)
    with tempfile.TemporaryDirectory(prefix="eog-exo-check-") as scratch:
        completed = subprocess.run(
            [str(venv / "bin" / "python"), str(SUPPORT / script), "--version", version, *options],
            cwd=tree,
            env=exo_environment(Path(scratch), guard=True),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    lines = completed.stdout.strip().splitlines()
    assert lines, completed.stderr[-3000:]
    result: dict[str, object] = json.loads(lines[-1])
    assert completed.returncode == 0, (result, completed.stderr[-3000:])
    return result


@versions
@pytest.mark.machine_wide
def test_connect_to_group_sweeps_through_exos_real_worker(
    version: str, work: Path, venv_cache: Path
) -> None:
    result = run_check("connect_to_group_check.py", version, work, venv_cache)
    assert result == {
        **result,
        "connect_to_group_forwarded": True,
        "orphan_killed": True,
        "own_runner_alive": True,
        "sweep_before_forward": True,
    }


@versions
@pytest.mark.machine_wide
def test_the_workers_plan_loop_is_not_stalled_while_an_orphan_is_waited_for(
    version: str, work: Path, venv_cache: Path
) -> None:
    """A leftover runner ending cleanly is waited for before ConnectToGroup; meanwhile
    exo's real plan_step serves another instance (LoadModel), and the ConnectToGroup
    starts once, after the orphan is gone. With the earlier release's patch (the sweep
    awaited inside plan_step) LoadModel came only after the orphan was gone."""
    result = run_check("connect_to_group_check.py", version, work, venv_cache, "--busy-orphan")
    assert result == {
        **result,
        "connect_to_group_forwarded": True,
        "orphan_killed": True,
        "sweep_before_forward": True,
        "connect_to_group_once": True,
        "other_instance_served_while_waiting": True,
        "wait_logged": True,
    }


@versions
@pytest.mark.machine_wide
def test_a_runner_failure_is_diagnosed_and_swept_through_exos_real_supervisor(
    version: str, work: Path, venv_cache: Path
) -> None:
    result = run_check("runner_failure_check.py", version, work, venv_cache)
    assert result == {
        **result,
        "diagnosis_logged": True,
        "orphan_killed": True,
        "unrecognised_ignored": True,
    }
