"""exo's worker, guarded with the package installed, is the same process after the hook
as before it (issue 35: no class or module of exo or its libraries patched, nothing
of the worker changed). A fresh interpreter loads the series' own module
(`exo/worker/orphan_guard.py`) over the exo-shaped types, as exo's worker has it, and
looks at itself before and after `await guard_worker()` (the marker, the start-up
sweep, a guardian started): every attribute of the modules of exo, loguru,
multiprocessing, anyio, threading, signal and logging, and of the classes they
define; its signal handlers and mask, process group, session, environment, loguru's
sinks, logging's handlers and its children. The guardian it started is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from exo_orphan_guard.rig import exo_runner
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import identity_of
from tests.helpers.waiting import wait_until

# The hook sweeps the machine and starts a guardian, which sweeps it too.
pytestmark = pytest.mark.machine_wide

HOOKS = "exo_orphan_guard.exo.hooks"
"""What the series' module reaches in the package (its `PACKAGE_HOOKS`)."""

_LOOK = """
import importlib.util, json, multiprocessing, os, signal, sys, threading, time, types
import logging
import anyio, loguru, psutil
sys.path.insert(0, sys.argv[1])
spec = importlib.util.spec_from_file_location("exo.worker.orphan_guard", sys.argv[2])
module = importlib.util.module_from_spec(spec)
sys.modules["exo.worker.orphan_guard"] = module
spec.loader.exec_module(module)
LIBRARIES = ("exo", "loguru", "multiprocessing", "anyio", "threading", "signal", "logging")

def look():
    seen = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or name.split(".")[0] not in LIBRARIES:
            continue
        for attribute, value in list(vars(mod).items()):
            if isinstance(value, types.ModuleType):
                continue  # a submodule imported: bookkeeping, not a patch
            seen[f"{name}:{attribute}"] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for key, member in list(vars(value).items()):
                    seen[f"{name}:{attribute}.{key}"] = id(member)
    for number in signal.valid_signals():
        try:
            seen[f"handler {number}"] = repr(signal.getsignal(number))
        except (OSError, ValueError):
            pass
    seen["mask"] = sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    seen["pgid, sid"] = [os.getpgrp(), os.getsid(0)]
    seen["environment"] = dict(os.environ)
    seen["loguru sinks"] = sorted(loguru.logger._core.handlers)
    seen["logging handlers"] = [repr(h) for h in logging.getLogger().handlers]
    seen["children"] = sorted(p.pid for p in psutil.Process().children())
    return seen

anyio.run(anyio.sleep, 0)  # exo's worker runs in anyio already: its lazy imports done
before = look()
anyio.run(module.guard_worker)
for thread in threading.enumerate():
    if thread.name == "exo-orphan-guard-guardian":
        thread.join(30)
after = look()
changed = {key: [before[key], after.get(key)] for key in before if after.get(key) != before[key]}
# Something new on a module or class that was there before is a patch too.
modules = {key.partition(":")[0] for key in before if ":" in key}
changed |= {
    key: [None, value]
    for key, value in after.items()
    if key not in before and key.partition(":")[0] in modules
}
# The guardian it started, found as the CLI finds it (it watches this process, alive).
from exo_orphan_guard.records import guardian_state
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.system import boot_id, settings
deadline = time.monotonic() + 15
while (state := guardian_state.running(host_directory(settings.registry_dir()), boot_id())) is None:
    if time.monotonic() > deadline:
        break
    time.sleep(0.05)
reached = sys.argv[3] in sys.modules
print(json.dumps({"changed": changed, "guardian": state and state.pid, "reached": reached}))
"""


def test_exos_worker_is_the_same_process_after_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.TOGGLE_ENV, "true")
    looked = subprocess.run(
        [sys.executable, "-c", _LOOK, exo_runner.EXO_SHAPED, str(exo_runner.IN_TREE_FILE), HOOKS],
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
