"""A pid freed and handed to a stranger never draws a signal meant for the process
that held it: real processes, real pid reuse (`ns_last_pid`, in the private pid
namespace `scripts/confined` gives the suite).

- A sweep that waits for two targets, one of which exits meanwhile, reads no family
  of its pid: before, the escalation after the wait listed the children of whatever
  process then held the pid, and signalled them.
- Between the check of an identity and the signal, the pid is freed and reused: the
  signal goes through the pidfd opened before the check, and reaches no one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweep_report import SweepReport
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import signalling
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of, liveness
from tests.helpers.processes import start_orphan
from tests.helpers.waiting import wait_until

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
STRANGER = """
import subprocess, sys
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
child = subprocess.Popen(["sleep", "120"], **quiet)
print(child.pid, flush=True)
sys.stdin.read()
"""
"""A process with a child of its own, until its stdin closes."""
WAIT_SECONDS = 4.0

pytestmark = [
    pytest.mark.skipif(
        sys.platform != "linux" or not os.access(NS_LAST_PID, os.W_OK),
        reason="choosing the next pid needs root in its own pid namespace (scripts/confined)",
    ),
    pytest.mark.machine_wide,
]


def _plant_stranger(pid: int) -> tuple[subprocess.Popen[str], ProcessIdentity]:
    """A stranger with a child, given `pid`, free now; its child's identity."""
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10.0), "the pid stays taken"
    with open(NS_LAST_PID, "w") as file:
        file.write(str(pid - 1))
    stranger = subprocess.Popen(
        [sys.executable, "-c", STRANGER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert stranger.pid == pid, "another process took the pid first"
    assert stranger.stdout is not None
    child = identity_of(int(stranger.stdout.readline()))
    assert child is not None
    return stranger, child


@pytest.fixture
def strangers() -> Iterator[list[subprocess.Popen[str]]]:
    planted: list[subprocess.Popen[str]] = []
    yield planted
    for stranger in planted:
        for pid in system.child_pids(stranger.pid):
            os.kill(pid, signal.SIGKILL)
        stranger.kill()
        stranger.wait()


def _begun_elsewhere(registry: Path, targets: list[ProcessIdentity], seconds: float) -> None:
    """`begun` lines as the guardian writes them: a sweep leaves those alone until then."""
    path = host_directory(registry) / endings.ENDINGS_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    for target in targets:
        endings.append(
            path,
            endings.Ending(
                event="begun",
                pid=target.pid,
                started=target.started,
                boot_id=system.boot_id(),
                at=time.time(),
                by="guardian",
                why="the guardian's SIGINT",
                deadline=time.monotonic() + seconds,
            ),
        )


def test_a_target_gone_during_the_wait_has_no_family_read_at_its_pid(
    isolated_environment: Path,
    tmp_path: Path,
    planted: list[ProcessIdentity],
    strangers: list[subprocess.Popen[str]],
) -> None:
    token = f"eog-reused-{uuid.uuid4().hex}"
    leave = tmp_path / "leave"
    leaving = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
    first = start_orphan([sys.executable, "-c", leaving, str(leave), token])
    second = start_orphan([sys.executable, "-c", "import time; time.sleep(600)", token])
    planted.extend([first, second])
    _begun_elsewhere(isolated_environment, [first, second], WAIT_SECONDS)
    waiting: list[str] = []
    outcome: list[SweepReport] = []
    swept = threading.Thread(
        target=lambda: outcome.append(
            sweep(
                match=re.escape(token),
                any_parent=True,
                fingerprint=False,
                grace=0.5,
                on_wait=waiting.append,
            )
        )
    )
    swept.start()
    assert wait_until(lambda: len(waiting) == 2, 10.0), waiting
    leave.touch()  # the first target exits by itself, within its wait
    stranger, child = _plant_stranger(first.pid)
    strangers.append(stranger)
    swept.join(timeout=60)
    (report,) = outcome
    results = {result.target: result for result in report.results}
    assert results[first].outcome == "exited" and results[first].signals == ()
    assert results[first].descendants == ()
    assert liveness(child) == "alive", "the child of the pid's new holder was signalled"
    assert liveness(second) == "gone"


def test_a_pid_reused_between_the_check_and_the_signal_gets_nothing(
    monkeypatch: pytest.MonkeyPatch, strangers: list[subprocess.Popen[str]]
) -> None:
    if system.BACKEND != "linux":
        pytest.skip("without pidfds (macOS) the window is the documented microseconds")
    target_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    target = identity_of(target_process.pid)
    assert target is not None
    real = signalling.liveness
    reused: list[ProcessIdentity] = []

    def checked_then_reused(identity: ProcessIdentity) -> str:
        state = real(identity)
        if identity == target and not reused:
            # Between the check and the signal: the target dies, its pid goes to a stranger.
            target_process.kill()
            target_process.wait()
            stranger, child = _plant_stranger(identity.pid)
            strangers.append(stranger)
            reused.append(child)
        return state

    monkeypatch.setattr(signalling, "liveness", checked_then_reused)
    assert signalling.send(target, signal.SIGTERM) == "gone"
    (stranger,) = strangers
    assert stranger.poll() is None, "the stranger that took the pid got the signal"
    assert scenarios.alive(reused) == reused
