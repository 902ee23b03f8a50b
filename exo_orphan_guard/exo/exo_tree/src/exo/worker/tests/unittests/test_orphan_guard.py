"""The orphan guard (exo/worker/orphan_guard.py), with no package installed: off by
default; on, a runner whose worker is SIGKILLed takes its own Shutdown and ends, and
without it is left running (what the guard is for); the worker writes its hand-over
marker and awaits the optional package off its event loop; every failure is one
warning."""

import importlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import cast

import anyio
import pytest
from loguru import logger

from exo.shared import constants
from exo.shared.types.tasks import Shutdown, Task
from exo.shared.types.worker.instances import BoundInstance
from exo.utils.channels import MpReceiver, mp_channel
from exo.worker import orphan_guard
from exo.worker.tests.constants import INSTANCE_1_ID, MODEL_A_ID, NODE_A, RUNNER_1_ID
from exo.worker.tests.unittests.conftest import get_bound_mlx_ring_instance


def _bound_instance() -> BoundInstance:
    return get_bound_mlx_ring_instance(INSTANCE_1_ID, MODEL_A_ID, RUNNER_1_ID, NODE_A)


@pytest.fixture
def hooks_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield
    monkeypatch.undo()
    importlib.reload(constants)  # as the rest of the suite imported them
    importlib.reload(orphan_guard)


def _reload(monkeypatch: pytest.MonkeyPatch, toggle: str | None) -> None:
    if toggle is None:
        monkeypatch.delenv("EXO_ORPHAN_GUARD", raising=False)
    else:
        monkeypatch.setenv("EXO_ORPHAN_GUARD", toggle)
    importlib.reload(constants)
    importlib.reload(orphan_guard)


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda message: lines.append(str(message)), level="WARNING")
    yield lines
    logger.remove(sink)


@pytest.mark.usefixtures("hooks_with")
@pytest.mark.parametrize(
    ("toggle", "on"),
    [(None, False), ("false", False), ("0", False), ("yes", False), ("true", True)]
    + [("True", True), ("1", True)],
)
def test_the_toggle_is_read_as_exo_reads_its_own(
    monkeypatch: pytest.MonkeyPatch, toggle: str | None, on: bool
):
    _reload(monkeypatch, toggle)
    assert constants.EXO_ORPHAN_GUARD is on
    assert orphan_guard.EXO_ORPHAN_GUARD is on


class _FakeHooks(ModuleType):
    def __init__(self, fail: bool, seconds: float = 0.0) -> None:
        super().__init__(orphan_guard.PACKAGE_HOOKS)
        self.calls = 0
        self.fail = fail
        self.seconds = seconds
        self.released = threading.Event()

    def guard_exo_worker(self) -> None:
        self.calls += 1
        self.released.wait(self.seconds)  # a sweep waiting on an orphan's ending
        if self.fail:
            raise RuntimeError("broken")


PACKAGE_HOOKS = orphan_guard.PACKAGE_HOOKS


class _NotInstalled(MetaPathFinder):
    """Whether or not this environment has the package, it is not found."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname == orphan_guard.PACKAGE:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _install(monkeypatch: pytest.MonkeyPatch, hooks: ModuleType | None) -> None:
    """The package as the worker finds it: `None` is not installed."""
    if hooks is None:
        for name in (orphan_guard.PACKAGE, "exo_orphan_guard.exo", PACKAGE_HOOKS):
            monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.setattr(sys, "meta_path", [_NotInstalled(), *sys.meta_path])
        return
    monkeypatch.setitem(sys.modules, orphan_guard.PACKAGE, ModuleType("p"))
    monkeypatch.setitem(sys.modules, "exo_orphan_guard.exo", ModuleType("e"))
    monkeypatch.setitem(sys.modules, PACKAGE_HOOKS, hooks)


@pytest.mark.usefixtures("hooks_with")
@pytest.mark.parametrize("toggle", ["true", None])
def test_the_worker_writes_its_marker_and_reaches_the_package_only_when_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, toggle: str | None
):
    monkeypatch.setenv("EXO_ORPHAN_GUARD_DIR", str(tmp_path / "guard"))
    hooks = _FakeHooks(fail=False)
    _install(monkeypatch, hooks)
    _reload(monkeypatch, toggle)
    before = time.time()

    anyio.run(orphan_guard.guard_worker)

    marker = tmp_path / "guard" / "handover" / f"{os.getpid()}.json"
    assert hooks.calls == (1 if toggle else 0)
    assert marker.exists() is bool(toggle)
    if toggle:
        content = cast(dict[str, float], json.loads(marker.read_text()))
        assert content["pid"] == os.getpid() and before <= content["at"] <= time.time()
        assert stat.S_IMODE(marker.stat().st_mode) == 0o600
        assert stat.S_IMODE(marker.parent.stat().st_mode) == 0o700
        assert [path.name for path in marker.parent.iterdir()] == [marker.name]


@pytest.mark.usefixtures("hooks_with")
@pytest.mark.parametrize(
    ("override", "where"),
    [("/x/g", Path("/x/g")), (" ", constants.EXO_CACHE_HOME / "orphan-guard")]
    + [(None, constants.EXO_CACHE_HOME / "orphan-guard")],
)
def test_the_marker_goes_where_the_guardian_looks(
    monkeypatch: pytest.MonkeyPatch, override: str | None, where: Path
):
    monkeypatch.delenv("EXO_ORPHAN_GUARD_DIR", raising=False)
    if override is not None:
        monkeypatch.setenv("EXO_ORPHAN_GUARD_DIR", override)
    assert orphan_guard._guard_dir() == where  # pyright: ignore[reportPrivateUsage]


@pytest.mark.usefixtures("hooks_with")
def test_the_worker_awaits_the_package_while_its_event_loop_serves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("EXO_ORPHAN_GUARD_DIR", str(tmp_path / "guard"))
    hooks = _FakeHooks(fail=False, seconds=0.5)
    _install(monkeypatch, hooks)
    _reload(monkeypatch, "true")
    ticks: list[float] = []

    async def plan_step() -> float:
        await orphan_guard.guard_worker()
        return time.monotonic()

    async def main() -> tuple[float, float]:
        started = returned = time.monotonic()
        async with anyio.create_task_group() as tg:

            async def tick() -> None:
                while hooks.calls == 0 or len(ticks) < 10:
                    ticks.append(time.monotonic())
                    await anyio.sleep(0.01)

            tg.start_soon(tick)
            returned = await plan_step()
        return started, returned

    started, returned = anyio.run(main)

    assert hooks.calls == 1
    assert returned - started >= 0.5, "the plan loop began before the sweep ended"
    assert len([at for at in ticks if at < returned]) >= 3, "the event loop stalled"


@pytest.mark.usefixtures("hooks_with")
def test_a_cancelled_worker_does_not_wait_for_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("EXO_ORPHAN_GUARD_DIR", str(tmp_path / "guard"))
    hooks = _FakeHooks(fail=False, seconds=60.0)
    _install(monkeypatch, hooks)
    _reload(monkeypatch, "true")

    async def main() -> None:
        with anyio.move_on_after(0.2):
            await orphan_guard.guard_worker()

    try:
        anyio.run(main)  # returns at the cancel, with the sweep still under way
        assert hooks.calls == 1 and not hooks.released.is_set()
    finally:
        hooks.released.set()


@pytest.mark.usefixtures("hooks_with")
@pytest.mark.parametrize("package", ["absent", "mismatched", "failing", "no-dir"])
def test_every_failure_in_the_worker_hook_is_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, warnings: list[str], package: str
):
    guard_dir = tmp_path / ("file" if package == "no-dir" else "guard")
    guard_dir.parent.mkdir(exist_ok=True)
    if package == "no-dir":
        guard_dir.write_text("")  # the marker's directory cannot be made
    monkeypatch.setenv("EXO_ORPHAN_GUARD_DIR", str(guard_dir))
    match package:
        case "absent" | "no-dir":
            _install(monkeypatch, None)
        case "mismatched":
            _install(monkeypatch, ModuleType(orphan_guard.PACKAGE_HOOKS))
        case _:
            _install(monkeypatch, _FakeHooks(fail=True))
    _reload(monkeypatch, "true")

    anyio.run(orphan_guard.guard_worker)  # raises nothing

    assert len(warnings) == (0 if package == "absent" else 1), warnings


@pytest.mark.usefixtures("hooks_with")
def test_a_runner_that_cannot_be_guarded_warns_once_and_runs_on(
    monkeypatch: pytest.MonkeyPatch, warnings: list[str]
):
    _reload(monkeypatch, "true")
    orphan_guard.guard_runner(_bound_instance(), mp_channel[Task]()[1])  # no parent
    assert len(warnings) == 1 and "not guarded" in warnings[0]


def run_runner(
    bound_instance: BoundInstance, task_receiver: MpReceiver[Task], ready: str
) -> None:
    """A runner as bootstrap.entrypoint starts one: the hook first, then its tasks."""
    orphan_guard.guard_runner(bound_instance, task_receiver)
    Path(ready).write_text(str(os.getpid()))
    for task in task_receiver:
        if isinstance(task, Shutdown):
            Path(ready).with_suffix(".shutdown").write_text(task.task_id)
            return


_WORKER = """
import multiprocessing, sys, time
from exo.shared.types.tasks import Task
from exo.utils.channels import mp_channel
from exo.worker.tests.unittests import test_orphan_guard as t

if __name__ == "__main__":
    multiprocessing.set_start_method("spawn", force=True)
    _, receiver = mp_channel[Task]()
    args = (t._bound_instance(), receiver, sys.argv[1])
    multiprocessing.Process(target=t.run_runner, args=args, daemon=True).start()
    time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = subprocess.run(
        ["ps", "-o", "stat=", "-p", str(pid)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return bool(state) and not state.startswith("Z")  # a zombie is gone too


def _wait(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.mark.parametrize("toggle", ["true", "false"])
def test_a_runner_whose_worker_is_killed_ends_through_its_shutdown_only_when_guarded(
    tmp_path: Path, toggle: str
):
    ready = tmp_path / "runner.pid"
    env = {**os.environ, "EXO_ORPHAN_GUARD": toggle}
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, str(ready)], env=env)
    runner = 0
    try:
        assert _wait(ready.exists, 60), "the runner did not start"
        runner = int(ready.read_text())
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        if toggle == "true":
            assert _wait(lambda: not _alive(runner), 10), (
                "the runner outlived its worker"
            )
            assert ready.with_suffix(".shutdown").exists()
        else:
            assert not _wait(lambda: not _alive(runner), 2), "it ended unguarded"
            assert not ready.with_suffix(".shutdown").exists()
    finally:
        worker.kill()
        worker.wait()
        if runner and _alive(runner):
            os.kill(runner, signal.SIGKILL)  # the orphan the guard is for
