"""A runner stuck in the kernel (uninterruptible sleep: here frozen by the cgroup v1
freezer, which SIGKILL does not end until it is thawed) is said once and tried again
ever more rarely, not ended again after every ending's wait, forever; once the kernel
lets it go (thawed, the SIGKILL already sent ends it), that is said once."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Generator
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.guardian.stuck import StuckRunners
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system.identity import Liveness, ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.guardian import READY, RunningGuardian, guardian_endings
from tests.helpers.waiting import wait_until

_FREEZER = Path("/sys/fs/cgroup/freezer")
SURVIVED = "survived SIGKILL"
"""What the guardian says of a runner that outlives SIGKILL."""
SETTLE_S = 2.0
"""The engine's wait for a SIGKILLed runner that may be on its way out (a frozen one
has SIGKILL pending), 30 s in the product: shortened so that the test waits less."""
_GUARDIAN = (
    "import sys; from exo_orphan_guard.sweeper import engine; "
    f"engine.EXIT_SETTLE_SECONDS = {SETTLE_S}; "
    "from exo_orphan_guard.tools.cli import entry_point; "
    "sys.argv[1:] = ['service', 'run']; entry_point()"
)


@contextlib.contextmanager
def _guardian(**env: str) -> Generator[RunningGuardian]:
    """`service run` with `SETTLE_S` for the engine's exit settle."""
    running = RunningGuardian({**os.environ, **env}, command=[sys.executable, "-c", _GUARDIAN])
    try:
        running.wait_for(READY)
        yield running
    finally:
        running.stop()


@contextlib.contextmanager
def _frozen(pid: int) -> Generator[Path]:
    """`pid` in a freezer cgroup of its own, frozen; thawed and the cgroup removed on
    the way out."""
    group = _FREEZER / f"eog-stuck-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        assert wait_until(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 5.0)
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        assert wait_until(lambda: not (group / "cgroup.procs").read_text().strip(), 10.0)
        group.rmdir()


def _begun(registry: Path, runner: ProcessIdentity) -> list[float]:
    return [
        line.at
        for line in guardian_endings(registry)
        if line.identity == runner and line.event == "begun"
    ]


@pytest.mark.machine_wide
@pytest.mark.skipif(sys.platform != "linux", reason="the cgroup v1 freezer is Linux's")
def test_a_runner_stuck_in_the_kernel_is_said_once_and_tried_ever_more_rarely(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    """Before, the next scan after an ending found it again and began another ending
    at once, each saying it survived; the rests' growth is the next test's."""
    if os.geteuid() != 0 or not (_FREEZER / "cgroup.procs").is_file():
        pytest.skip("needs root and the cgroup v1 freezer")
    env = {"EXO_ORPHAN_GUARD_SCAN_INTERVAL": "0.1", "EXO_ORPHAN_GUARD_GRACE": "0.5"}
    with _guardian(**env) as running:
        worker = scenarios.start_worker(
            ["idle"], watch="none", python=exo_python, notes=notes, registry=isolated_environment
        )
        try:
            running.watching(worker.pid)
            (runner,) = [runner.identity for runner in worker.runners]
            with _frozen(runner.pid):
                assert system.stuck_state(runner.pid) == "D"
                scenarios.kill_worker(worker)
                # The first ending: SIGINT, SIGKILL, and the wait for what SIGKILL has
                # not ended yet (longer while it seems on its way out).
                said = running.wait_for(rf"runner {runner.pid} {SURVIVED}", 90.0)
                survived_at = time.monotonic()
                assert "(state D)" in said, said
                # Tried again after a rest of 30 scans (3 s here), not at the next scan.
                tried = wait_until(lambda: len(_begun(isolated_environment, runner)) >= 2, 90.0)
                assert tried, running.lines
                assert time.monotonic() - survived_at >= 2.0, running.lines
                assert sum(SURVIVED in line for line in running.lines) == 1, running.lines
            running.wait_for(rf"runner {runner.pid}, stuck in the kernel after SIGKILL, is gone")
            assert scenarios.wait_gone([runner], 5.0)[runner] is not None
        finally:
            scenarios.cleanup(worker)


def test_each_rest_is_twice_the_last_up_to_an_hour_and_a_gone_runner_is_forgotten() -> None:
    alive: dict[ProcessIdentity, Liveness] = {}
    stuck = StuckRunners(60.0, lambda runner: alive.get(runner, "gone"))
    runner = ProcessIdentity(Pid(4242), 1.0)
    alive[runner] = "alive"
    assert stuck.survived(runner, now=0.0) is True
    assert stuck.resting(59.0) == {runner} and stuck.resting(60.0) == frozenset()
    assert stuck.survived(runner, now=100.0) is False
    assert stuck.resting(219.0) == {runner} and stuck.resting(220.0) == frozenset()
    for _ in range(10):
        stuck.survived(runner, now=1000.0)
    assert stuck.resting(1000.0 + 3599.0) == {runner}
    assert stuck.resting(1000.0 + 3600.0) == frozenset()
    assert stuck.gone() == []
    alive[runner] = "gone"
    assert stuck.gone() == [runner] and not stuck.known(runner)
