"""The orphan-guard hooks (exo/worker/orphan_guard.py): off by default, one warning
when on without the package, and forwarding when on with it. With the package
installed, a runner whose worker is SIGKILLed ends by taking its own Shutdown, and
without the guard it is left running (what the hooks are for)."""

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from loguru import logger

from exo.shared.types.tasks import Shutdown, Task
from exo.shared.types.worker.instances import BoundInstance
from exo.utils.channels import MpReceiver, mp_channel
from exo.worker import orphan_guard
from exo.worker.tests.constants import INSTANCE_1_ID, MODEL_A_ID, NODE_A, RUNNER_1_ID
from exo.worker.tests.unittests.conftest import get_bound_mlx_ring_instance

PACKAGE_HOOKS = "exo_orphan_guard.exo.hooks"


def _bound_instance() -> BoundInstance:
    return get_bound_mlx_ring_instance(INSTANCE_1_ID, MODEL_A_ID, RUNNER_1_ID, NODE_A)


@pytest.fixture
def hooks_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield
    monkeypatch.undo()
    importlib.reload(orphan_guard)  # as the rest of the suite imported it


def _reload(monkeypatch: pytest.MonkeyPatch, toggle: str | None) -> None:
    if toggle is None:
        monkeypatch.delenv("EXO_ORPHAN_GUARD", raising=False)
    else:
        monkeypatch.setenv("EXO_ORPHAN_GUARD", toggle)
    importlib.reload(orphan_guard)


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
    assert orphan_guard.EXO_ORPHAN_GUARD is on


class _FakePackageHooks(ModuleType):
    def __init__(self) -> None:
        super().__init__(PACKAGE_HOOKS)
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def guard_exo_runner(
        self, bound_instance: BoundInstance, task_receiver: MpReceiver[Task]
    ) -> None:
        self.calls.append(("guard_exo_runner", (bound_instance, task_receiver)))

    def guard_exo_worker(self) -> None:
        self.calls.append(("guard_exo_worker", ()))


@pytest.mark.usefixtures("hooks_with")
@pytest.mark.parametrize("toggle", ["true", None])
def test_the_hooks_reach_the_package_only_when_on(
    monkeypatch: pytest.MonkeyPatch, toggle: str | None
):
    package = _FakePackageHooks()
    monkeypatch.setitem(sys.modules, PACKAGE_HOOKS, package)
    _reload(monkeypatch, toggle)
    bound_instance = _bound_instance()
    _, task_receiver = mp_channel[Task]()

    orphan_guard.guard_worker()
    orphan_guard.guard_runner(bound_instance, task_receiver)

    expected = [
        ("guard_exo_worker", ()),
        ("guard_exo_runner", (bound_instance, task_receiver)),
    ]
    assert package.calls == (expected if toggle else [])


@pytest.mark.usefixtures("hooks_with")
def test_on_without_the_package_the_hooks_warn_once_and_do_nothing(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setitem(sys.modules, PACKAGE_HOOKS, None)  # its import fails
    _reload(monkeypatch, "true")
    warnings: list[str] = []
    sink = logger.add(lambda message: warnings.append(str(message)), level="WARNING")
    try:
        orphan_guard.guard_worker()
        orphan_guard.guard_worker()
    finally:
        logger.remove(sink)
    assert len(warnings) == 1
    assert "exo-orphan-guard is not installed" in warnings[0]


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
from exo.worker import orphan_guard
from exo.worker.tests.unittests import test_orphan_guard as t

if __name__ == "__main__":
    multiprocessing.set_start_method("spawn", force=True)
    orphan_guard.guard_worker()
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
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone too
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wait(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.mark.skipif(sys.platform != "linux", reason="reads the process table in /proc")
@pytest.mark.parametrize("toggle", ["true", "false"])
def test_a_runner_whose_worker_is_killed_ends_only_when_guarded(
    tmp_path: Path, toggle: str
):
    if toggle == "true":
        pytest.importorskip("exo_orphan_guard", reason="the guard is not installed")
    ready = tmp_path / "runner.pid"
    env = {
        **os.environ,
        "EXO_ORPHAN_GUARD": toggle,
        "EXO_ORPHAN_GUARD_DIR": str(tmp_path / "registry"),
    }
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, str(ready)], env=env)
    runner = 0
    try:
        assert _wait(ready.exists, 30), "the runner did not start"
        runner = int(ready.read_text())
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        ended = _wait(lambda: not _alive(runner), 5)
        assert ended is (toggle == "true")
        assert ready.with_suffix(".shutdown").exists() is (toggle == "true")
    finally:
        worker.kill()
        worker.wait()
        if runner and _alive(runner):
            os.kill(runner, signal.SIGKILL)  # the orphan the guard is for
