"""exo's worker, with the package installed, makes sure a guardian runs: it starts
one, detached, if none runs, and that one leaves once no exo is left to watch."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from exo_orphan_guard.exo.guardian_start import ensure_guardian
from exo_orphan_guard.records import guardian_state, handover_marker
from exo_orphan_guard.records.registry import Registry, RunnerRecord
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import boot_id, process_group, settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.guardian import guardian_home
from tests.helpers.processes import start_orphan
from tests.helpers.waiting import wait_until

# A guardian sweeps the machine at its start.
pytestmark = pytest.mark.machine_wide


def _running(registry: Path) -> guardian_state.GuardianState | None:
    """The guardian that runs (its state is the user's, not `registry`'s)."""
    return guardian_state.running(guardian_home(), boot_id())


def test_a_worker_starts_one_guardian_detached_and_then_leaves_it_be(
    isolated_environment: Path,
) -> None:
    said = ensure_guardian()
    assert said.startswith("started a guardian"), said
    assert wait_until(lambda: _running(isolated_environment) is not None, 15.0), said
    state = _running(isolated_environment)
    assert state is not None and state.mode == "worker"
    try:
        assert process_group(state.pid) != os.getpgrp(), "exo's Ctrl-C would reach it"
        # Not exo's child: a guardian never watches its own ancestors.
        ancestors = [parent.pid for parent in psutil.Process(state.pid).parents()]
        assert os.getpid() not in ancestors, ancestors
        assert ensure_guardian() == f"the guardian runs (pid {state.pid}, worker)"
    finally:
        os.kill(state.pid, signal.SIGTERM)
        identity = identity_of(state.pid)
        if identity is not None:
            assert scenarios.wait_gone([identity], 10.0)[identity] is not None


_IN_A_NAMESPACE_OF_ITS_OWN = """
import os, subprocess, sys, time
worker = subprocess.run(
    [sys.executable, "-c",
     "from exo_orphan_guard.exo.guardian_start import ensure_guardian; print(ensure_guardian())"],
    capture_output=True, text=True, check=True,
)
print(worker.stdout, end="", flush=True)
pid = int(worker.stdout.split("(pid ")[1].split(")")[0])
deadline = time.monotonic() + 15
while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
    with open(f"/proc/{pid}/stat") as stat:
        if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
            break
    time.sleep(0.05)
print("left" if time.monotonic() < deadline else "stayed", flush=True)
"""


def test_a_guardian_a_worker_started_leaves_once_no_exo_is_left(
    isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a pid namespace of its own, where the worker that starts it is the only exo
    (the session's decoys would keep a guardian beside them busy): once the worker
    is gone, the guardian leaves by itself."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("a pid namespace of its own needs root and util-linux unshare")
    monkeypatch.setenv(settings.SCAN_INTERVAL_ENV, "0.2")
    namespace = subprocess.run(
        [
            unshare,
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            _IN_A_NAMESPACE_OF_ITS_OWN,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = namespace.stdout.splitlines()
    assert lines and lines[0].startswith("started a guardian"), (lines, namespace.stderr)
    # Its own pid namespace: a host directory of its own in the guardian's.
    (path,) = guardian_home().parent.glob("*/guardian.log")
    log = path.read_text()
    assert lines[-1] == "left", log
    assert "no exo process left to watch: leaving" in log, log


def test_a_second_guardian_started_by_a_worker_leaves_at_once(isolated_environment: Path) -> None:
    assert ensure_guardian().startswith("started a guardian")
    assert wait_until(lambda: _running(isolated_environment) is not None, 15.0)
    state = _running(isolated_environment)
    assert state is not None
    try:
        second = subprocess.run(
            [sys.executable, "-m", "exo_orphan_guard", "service", "run", "--mode", "worker"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode == 0 and "leaving it to guard" in second.stderr
    finally:
        os.kill(state.pid, signal.SIGTERM)


def test_exos_worker_hook_sweeps_then_starts_a_guardian(
    isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the local series' `guard_worker()` reaches with the package installed: the
    hand-over marker for this worker (its runners hand themselves Shutdown), the
    sweep, a guardian."""
    monkeypatch.setenv(settings.TOGGLE_ENV, "true")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from exo_orphan_guard.exo.hooks import "
            "guard_exo_worker; guard_exo_worker(); time.sleep(60)",
        ],
    )
    try:
        assert wait_until(lambda: _running(isolated_environment) is not None, 20.0)
        state = _running(isolated_environment)
        assert state is not None and state.mode == "worker"
        os.kill(state.pid, signal.SIGTERM)
        started = psutil.Process(worker.pid).create_time()
        assert handover_marker.hands_over(settings.registry_dir(), worker.pid, started)
    finally:
        worker.kill()
        worker.wait()


_SLOW_TO_END = (
    "import signal, sys, time\n"
    "def end(*_):\n"
    "    time.sleep(1.0)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGINT, end)\n"
    "signal.signal(signal.SIGTERM, end)\n"
    "time.sleep(600)\n"
)


def test_exos_worker_hook_returns_once_the_dead_exos_runners_are_gone(
    isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exo's worker awaits the hook before its plan loop: when it returns, the orphan
    of a dead worker (one that takes a second to end) is gone, so no new runner meets
    it."""
    monkeypatch.setenv(settings.TOGGLE_ENV, "true")
    orphan = start_orphan([sys.executable, "-c", _SLOW_TO_END])
    registry, problem = Registry.open(settings.registry_dir(), create=True)
    assert registry is not None, problem
    dead_worker = ProcessIdentity(Pid(os.getpid()), 1.0)  # started at 1.0: not us
    registry.write(
        RunnerRecord(
            pid=orphan.pid,
            started=orphan.started,
            boot_id=boot_id(),
            uid=os.geteuid(),
            worker=dead_worker,
            exe=psutil.Process(orphan.pid).exe(),
            argv=tuple(psutil.Process(orphan.pid).cmdline()),
            pgid=None,
            recorded_at=time.time(),
            labels={"runner_id": "planted"},
        )
    )
    script = (
        "import os, sys\n"
        "from exo_orphan_guard.exo.hooks import guard_exo_worker\n"
        "from exo_orphan_guard.system.identity import identity_of\n"
        "guard_exo_worker()\n"
        f"print(identity_of({orphan.pid}) is None, flush=True)\n"
        "guard_exo_worker()  # a second Worker of the same process: at once\n"
        "print('again', flush=True)\n"
        "import time; time.sleep(60)  # exo runs on\n"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert worker.stdout is not None
        said = [worker.stdout.readline().strip() for _ in range(2)]
        assert said == ["True", "again"], said
        # The hook then started a guardian; left running, it would sweep later tests'
        # orphans.
        assert wait_until(lambda: _running(isolated_environment) is not None, 15.0)
    finally:
        worker.kill()
        worker.wait()
        state = _running(isolated_environment)
        if state is not None:
            os.kill(state.pid, signal.SIGTERM)
            assert wait_until(lambda: identity_of(state.pid) is None, 15.0)
        if identity_of(orphan.pid) is not None:
            os.kill(orphan.pid, signal.SIGKILL)
