from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Final

import psutil
import pytest

from exo_orphan_guard import scenarios, settings
from exo_orphan_guard.identity import ProcessIdentity
from exo_orphan_guard.scenario_worker import RunnerKind, SpawnFrom, Watch
from tests.helpers.processes import carrying, kill_all, make_fake_exo_environment


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No test reads the developer's toggles or writes to ~/.exo."""
    for name in (
        settings.TOGGLE_ENV,
        settings.STRATEGY_ENV,
        settings.GRACE_ENV,
        settings.WORKER_ENV,
        settings.RUNNER_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    registry = tmp_path / "registry"
    monkeypatch.setenv(settings.DIR_ENV, str(registry))
    return registry


StartWorker = Callable[..., scenarios.StartedWorker]


@pytest.fixture
def start_worker(isolated_environment: Path) -> Iterator[StartWorker]:
    """Start scenario workers; whatever they leave behind is killed at teardown."""
    started: list[scenarios.StartedWorker] = []

    def start(
        runners: Sequence[RunnerKind],
        *,
        watch: Watch = "guard",
        strategy: settings.Strategy = "auto",
        spawn_from: SpawnFrom = "main",
        extra_env: dict[str, str] | None = None,
    ) -> scenarios.StartedWorker:
        worker = scenarios.start_worker(
            runners,
            watch=watch,
            strategy=strategy,
            spawn_from=spawn_from,
            registry=isolated_environment,
            extra_env=extra_env,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        scenarios.cleanup(worker)


@pytest.fixture(scope="session")
def exo_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python whose environment has exo installed, as far as the sweep can tell."""
    return make_fake_exo_environment(tmp_path_factory.mktemp("exo-env") / "venv")


@pytest.fixture
def planted() -> Iterator[list[ProcessIdentity]]:
    """Processes a test plants; killed, with their descendants, at teardown."""
    processes: list[ProcessIdentity] = []
    yield processes
    kill_all(processes)


SESSION_TAG: Final = "EOG_TEST_SESSION"
"""Inherited by every process the suite starts: what is still alive at the end leaked."""
_LEFTOVER_GRACE_SECONDS: Final = 5.0


def pytest_sessionstart(session: pytest.Session) -> None:
    os.environ[SESSION_TAG] = uuid.uuid4().hex


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any process it started outlived it (and kill those)."""
    tag = os.environ.get(SESSION_TAG)
    if tag is None or sys.platform != "linux":
        return
    mine = {os.getpid(), *(parent.pid for parent in psutil.Process().parents())}
    # This process's own multiprocessing resource tracker ends with it, not before.
    tracker: int | None = getattr(resource_tracker._resource_tracker, "_pid", None)  # pyright: ignore[reportPrivateUsage]
    if tracker is not None:
        mine.add(tracker)
    started = [identity for identity in carrying(SESSION_TAG, tag) if identity.pid not in mine]
    left = scenarios.wait_gone(started, _LEFTOVER_GRACE_SECONDS)
    leaked = [identity for identity, seen in left.items() if seen is None]
    if not leaked:
        return
    described = [_command_line(identity.pid) for identity in leaked]
    kill_all(leaked)
    print(f"\n{len(leaked)} process(es) started by the suite outlived it: {described}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _command_line(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        return str(pid)
