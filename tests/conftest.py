from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Final, final

import psutil
import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.rig.scenario_worker import SpawnFrom, Watch
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity
from tests import passes
from tests.helpers import exo_trees
from tests.helpers.decoys import Decoys, start_decoys
from tests.helpers.processes import carrying, kill_all, make_fake_exo_environment

OUTER_PID_NAMESPACE_ENV: Final = "EOG_OUTER_PID_NAMESPACE"
"""Set by `scripts/confined` to the pid namespace it left for a private one."""


def _in_private_pid_namespace() -> bool:
    """Whether this session runs in the pid namespace `scripts/confined` made for it,
    where every process it can see is one the suite started."""
    outer = os.environ.get(OUTER_PID_NAMESPACE_ENV)
    try:
        return outer is not None and os.readlink("/proc/self/ns/pid") != outer
    except OSError:
        return False


CONFINED: Final = _in_private_pid_namespace()
MACHINE_WIDE_SKIP: Final = (
    "runs a machine-wide sweep, which would signal processes this suite did not start: "
    "it runs only in a private pid namespace (`make test` as root, through scripts/confined)"
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test for the passes `tests/passes.py`'s rule gives it (before `-m`
    selects on those marks)."""
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        for name in sorted(passes.passes_of(module.__name__, getattr(item, "fixturenames", ()))):
            item.add_marker(name)


SHARD_ENV: Final = "EOG_SHARD"
"""`K/N`: run only the K-th of N shards of what `-m` selected (`make test` runs each
pass in three shards, four at a time, each in its own pid namespace)."""


@final
class _Shard:
    """A plugin of its own: this module's `pytest_collection_modifyitems` runs first."""

    def __init__(self, index: int, count: int) -> None:
        self.index = index
        self.count = count

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """After `-m`: this shard's test modules. Modules go to the shards in turn, in
        collection order: whole, since a module's tests share its fixtures, and in turn,
        which spreads a pass's heavy modules over its parts."""
        order: dict[Path, int] = {}
        for item in items:
            order.setdefault(item.path, len(order))
        kept = [item for item in items if order[item.path] % self.count == self.index - 1]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    # Taken out of the environment: a pytest that a test runs is not this shard.
    shard = os.environ.pop(SHARD_ENV, None)
    if not shard:
        return
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise pytest.UsageError(f"{SHARD_ENV}={shard!r}: expected K/N with 1 <= K <= N")
    config.pluginmanager.register(_Shard(int(index), int(count)), "eog-shard")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("machine_wide") is not None and not CONFINED:
        pytest.skip(MACHINE_WIDE_SKIP)


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No test reads the developer's toggles or writes to ~/.exo or exo's cache
    directory, or keeps an undo record of `patch apply` in the developer's state
    directory."""
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
    # The guardian's lock and state, and the record of begun endings, are per user and
    # machine whatever the environment: each test has its own all the same.
    monkeypatch.setenv(settings.USER_DIR_ENV, str(tmp_path / "user"))
    # The watch's tests time runners that never come back from native code (`gil`,
    # `deaf`): wedged by construction, ended at the old 0.5 s bound. The tests of the
    # busy wait set their own (tests/test_busy_ending.py, tests/test_sweep_busy.py).
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, "0")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    # exo's cache directory, where guarded exo-shaped runners record themselves.
    monkeypatch.delenv("EXO_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
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
        notes: Path | None = None,
    ) -> scenarios.StartedWorker:
        worker = scenarios.start_worker(
            runners,
            watch=watch,
            strategy=strategy,
            spawn_from=spawn_from,
            registry=isolated_environment,
            extra_env=extra_env,
            notes=notes,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        scenarios.cleanup(worker)


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    """A directory where stand-in runners write what happened to them."""
    directory = tmp_path / "notes"
    directory.mkdir()
    return directory


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts into the list; killed and reaped at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.fixture(scope="session")
def exo_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python whose environment has exo installed, as far as the sweep can tell."""
    return make_fake_exo_environment(tmp_path_factory.mktemp("exo-env") / "venv")


@pytest.fixture(scope="session")
def exo_venv_cache() -> Path:
    return exo_trees.venv_cache()


@pytest.fixture(scope="session")
def exo_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's throw-away copies of exo go."""
    return tmp_path_factory.mktemp("exo-trees")


_decoys: list[Decoys] = []


@pytest.fixture(scope="session", autouse=True)
def session_decoys(exo_python: str) -> Decoys:
    """Started before the first test; `pytest_sessionfinish` fails the run if one is gone."""
    decoys = start_decoys(exo_python)
    _decoys.append(decoys)
    return decoys


@pytest.fixture
def planted() -> Iterator[list[ProcessIdentity]]:
    """Processes a test plants; killed, with their descendants, at teardown."""
    processes: list[ProcessIdentity] = []
    yield processes
    kill_all(processes)


SESSION_TAG: Final = "EOG_TEST_SESSION"
"""Inherited by every process the suite starts: what is still alive at the end leaked."""
_LEFTOVER_GRACE_SECONDS: Final = float(os.environ.get("EOG_LEFTOVER_GRACE_SECONDS") or 5.0)
"""How long what the suite started has to leave by itself; test_session_checks'
inner sessions, whose leak never leaves, set less."""


def pytest_sessionstart(session: pytest.Session) -> None:
    os.environ[SESSION_TAG] = uuid.uuid4().hex
    # A suite started as a background job of a non-interactive shell (`make test &` in
    # a script) inherits SIGINT ignored, and so would every runner it starts: runners
    # that cannot take the guardian's SIGINT are another test's case, not every test's.
    # A handler here becomes the default action in the processes the tests exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _check_decoys(session)
    _check_leftovers(session)


_DYING_SECONDS: Final = 1.0
"""A decoy that the session's last test killed may still be exiting when the session
ends (SIGKILL returns before its target is gone): it has this long to be seen gone."""


def _check_decoys(session: pytest.Session) -> None:
    """Fail the run if a test took one of the session's decoys."""
    if _decoys:
        time.sleep(_DYING_SECONDS)
    for decoys in _decoys:
        gone = decoys.gone()
        decoys.stop()
        if gone:
            print(f"\na test signalled what it did not start; gone: {'; '.join(gone)}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _check_leftovers(session: pytest.Session) -> None:
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
