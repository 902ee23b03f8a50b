"""exo's worker, guarded with the package installed, and its runner are the same
processes after their hooks as before them (issue 35: no class or module of exo or its
libraries patched, nothing of the process changed). A fresh interpreter loads the
series' own modules over the exo-shaped types, as exo's processes have them, and looks
at itself (`tests.helpers.self_look`) before and after its hook: the local series'
`await guard_worker()` (`exo/worker/orphan_guard.py`) and the PR's `await
end_leftover_runners()` in the worker (the marker, the start-up sweeps, a guardian
started), the PR's `watch_parent(...)` (`exo/worker/runner/parent_watch.py`) in a
spawned runner. The look: every attribute
of the modules of exo, loguru, multiprocessing, anyio, threading, signal and logging,
and of the classes they define; its signal handlers and mask, process group, session,
environment, loguru's sinks, logging's handlers and its children. The guardian the
worker started is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.rig import exo_runner
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import identity_of
from tests.helpers.waiting import wait_until

# The hook sweeps the machine and starts a guardian, which sweeps it too.
pytestmark = pytest.mark.machine_wide

ROOT = Path(__file__).resolve().parents[1]
IN_TREE = (exo_runner.EXO_SHAPED, str(exo_runner.IN_TREE_FILE))
HOOKS = "exo_orphan_guard.exo.hooks"
"""What the series' module reaches in the package (its `PACKAGE_HOOKS`)."""

_LOOK = """
import json, sys, threading, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import anyio
from tests.helpers import self_look
self_look.load_what_exo_has()
before = self_look.look()
import importlib
local = importlib.import_module("exo.worker.orphan_guard")
sweep = importlib.import_module("exo.worker.runner.leftover_runners")
async def start():
    await local.guard_worker()
    await sweep.end_leftover_runners()
anyio.run(start)
for thread in threading.enumerate():
    if thread.name == "exo-orphan-guard-guardian":
        thread.join(30)
changed = self_look.changes(before, self_look.look())
# The guardian it started, found as the CLI finds it (it watches this process, alive).
from exo_orphan_guard.records import guardian_state
from exo_orphan_guard.records.user_dir import user_dir
from exo_orphan_guard.system import boot_id
deadline = time.monotonic() + 15
while (state := guardian_state.running(user_dir(create=True)[0], boot_id())) is None:
    if time.monotonic() > deadline:
        break
    time.sleep(0.05)
reached = sys.argv[4] in sys.modules
print(json.dumps({"changed": changed, "guardian": state and state.pid, "reached": reached}))
"""


def test_exos_worker_is_the_same_process_after_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "true")
    looked = subprocess.run(
        [sys.executable, "-c", _LOOK, str(ROOT), *IN_TREE, HOOKS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert looked.returncode == 0, looked.stderr
    said = json.loads(looked.stdout)
    guardian = None if said["guardian"] is None else identity_of(said["guardian"])
    try:
        assert said["reached"] and said["guardian"] is not None, looked.stderr  # it acted
        assert said["changed"] == {}
    finally:
        # With its worker gone it leaves by itself; a test waits for no one.
        if guardian is not None and identity_of(guardian.pid) == guardian:
            os.kill(guardian.pid, signal.SIGTERM)
            assert wait_until(lambda: identity_of(guardian.pid) is None, 15.0)


_SPAWN_A_RUNNER = """
import multiprocessing, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from exo_orphan_guard.rig import exo_runner
from tests.helpers import self_look
bound_instance, task_receiver, _ = exo_runner.channel_and_instance("looking")
runner = multiprocessing.get_context("spawn").Process(
    target=self_look.runner_looks, args=(bound_instance, task_receiver, sys.argv[3], sys.argv[4])
)
runner.start()
runner.join(60)
sys.exit(runner.exitcode)
"""
"""A worker of its own (the exo-shaped types never enter the test's process): it makes
a runner's task stream and bound instance and spawns the runner with them, as exo's
worker does."""


def test_exos_runner_is_the_same_process_after_the_hook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "true")
    out = tmp_path / "looked.json"
    spawned = subprocess.run(
        [sys.executable, "-c", _SPAWN_A_RUNNER, str(ROOT), *IN_TREE, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert spawned.returncode == 0, spawned.stderr
    said = json.loads(out.read_text())
    assert said["new threads"] == ["parent-watch"]  # it acted
    assert said["changed"] == {}
    assert not said["package imported"]
