"""The guardian and runners guarded by exo's own hooks module (`exo_tree/.../
orphan_guard.py`, in exo-shaped runners: `rig.exo_runner`), whose worker is really
SIGKILLed, with the hand-over marker written (`records/handover_marker`) as exo's
worker writes it at its start. Each case has its control.

- A runner inside exo's own shutdown (its live worker's `Shutdown`) when the worker
  dies: with the marker, the guardian leaves it alone for the grace, its shutdown
  finishes and it exits by itself, no signal sent; without it, SIGINT at once cuts
  that shutdown short.
- A runner that ran its shutdown but whose exit blocks for good on its full event
  pipe to the dead worker (exo's `event_sender.join()`): with the guardian, SIGINT
  once the grace is out ends it within the bounds; without, it stays, orphaned.

The first holds whichever of the guardian's endings finds the runner: its start-up
sweep, run beside its first scan, can read the table after the kill and act before
the exit watch's ending does (it did so in 3 of 20 runs of this file before the
guardian remembered the runners of a worker with a marker).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Final

import pytest

from exo_orphan_guard.records import handover_marker
from exo_orphan_guard.rig import notes as runner_notes
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.exo_runner import OWN_SHUTDOWN_SECONDS_ENV, SENT
from exo_orphan_guard.system.identity import ProcessIdentity, liveness
from tests.helpers.guardian import ended_line, guardian
from tests.helpers.waiting import wait_for_note, wait_until

# A guardian sweeps the machine at its start and ends any exo orphan it finds.
pytestmark = [
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc"),
]

OWN_SHUTDOWN: Final = 3.0
"""The runner's own `Runner.shutdown` (exo's takes about a second)."""
GRACE: Final = 10.0
"""Far longer than the shutdown: it finishes inside the grace however loaded the
machine is, and a SIGINT at once (no marker) comes well before it would."""
FULL_GRACE: Final = 5.0
"""Far longer than the blocked runner's way from the worker's death to its join (its
own shutdown takes `exo_runner.OWN_SHUTDOWN_SECONDS` there): the SIGINT finds it
blocked in the join, not still in its shutdown."""
BUSY_WAIT: Final = 6.0
MARGIN: Final = 8.0
"""For a loaded 2-core machine: the exit watch, the guardian's reading of the table."""


def _start(
    kind: scenarios.RunnerKind, exo_python: str, notes: Path, registry: Path, **env: str
) -> tuple[scenarios.StartedWorker, ProcessIdentity]:
    """A worker of one exo-shaped runner, guarded by exo's own hooks module, in an
    environment the guardian takes for exo's."""
    worker = scenarios.start_worker(
        [kind], watch="exo", python=exo_python, notes=notes, registry=registry, extra_env=env
    )
    (runner,) = [runner.identity for runner in worker.runners]
    return worker, runner


def _write_marker(registry: Path, worker: scenarios.StartedWorker) -> Path:
    """What exo's `guard_worker` writes at the worker's start."""
    marker = handover_marker.marker_path(registry, worker.pid)
    marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    marker.write_text(json.dumps({"pid": worker.pid, "at": time.time()}))
    marker.chmod(0o600)
    return marker


def _events(notes: Path, runner: ProcessIdentity) -> list[str]:
    return [str(note["event"]) for note in runner_notes.read_notes(notes, runner.pid)]


def _in_a_long_shutdown(
    exo_python: str, notes: Path, registry: Path
) -> tuple[scenarios.StartedWorker, ProcessIdentity]:
    """An `exoidle` runner whose own shutdown takes `OWN_SHUTDOWN`."""
    env = {OWN_SHUTDOWN_SECONDS_ENV: str(OWN_SHUTDOWN)}
    return _start("exoidle", exo_python, notes, registry, **env)


def _in_own_shutdown_when_killed(
    notes: Path, worker: scenarios.StartedWorker, runner: ProcessIdentity
) -> tuple[float, float | None]:
    """The live worker sends exo's Shutdown; once the runner took it, the worker is
    SIGKILLed. When (monotonic) it was killed, and when the runner was seen gone."""
    scenarios.ask_to_shut_down(worker)
    wait_for_note(notes, runner.pid, "took")
    wait_for_note(notes, worker.pid, SENT)  # its write lock let go: see `exo_runner`
    killed_at = scenarios.kill_worker(worker)
    return killed_at, scenarios.wait_gone([runner], GRACE + MARGIN)[runner]


def test_a_runner_inside_exos_own_shutdown_finishes_it_untouched_within_the_grace(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    worker, runner = _in_a_long_shutdown(exo_python, notes, isolated_environment)
    try:
        # Before the guardian's first scan, so that it watches the worker as one
        # whose runners hand themselves their Shutdown from the first.
        _write_marker(isolated_environment, worker)
        with guardian(isolated_environment, EXO_ORPHAN_GUARD_GRACE=str(GRACE)) as running:
            assert "hand themselves" in running.watching(worker.pid)
            killed_at, gone_at = _in_own_shutdown_when_killed(notes, worker, runner)
            assert gone_at is not None, running.lines
            assert gone_at - killed_at < GRACE, "it outlived the grace: signalled, maybe"
            events = _events(notes, runner)
            assert events == ["took", "shut down", "finally"], (events, running.lines)
            running.wait_for(rf"runner {runner.pid} ended .*\(no signal\)")
            # No signal sent: the guardian writes no `ended` line of its own.
            assert ended_line(isolated_environment, runner, timeout=1.0) is None
    finally:
        scenarios.cleanup(worker)


def test_without_the_marker_the_guardian_cuts_exos_own_shutdown_short(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    """The control: what an exo without the series gets. The SIGINT at once unwinds
    the runner's own shutdown (as it would unwind exo's `Runner.shutdown`)."""
    worker, runner = _in_a_long_shutdown(exo_python, notes, isolated_environment)
    try:
        with guardian(isolated_environment, EXO_ORPHAN_GUARD_GRACE=str(GRACE)) as running:
            assert "hand themselves" not in running.watching(worker.pid)
            _, gone_at = _in_own_shutdown_when_killed(notes, worker, runner)
            assert gone_at is not None, running.lines
            events = _events(notes, runner)
            assert "shut down" not in events, (events, running.lines)
            assert events[:2] == ["took", "raised"], (events, running.lines)
            line = ended_line(isolated_environment, runner)
            assert line is not None, running.lines
            assert (line.how, line.signal, line.step) == ("clean", "SIGINT", "interrupt")
    finally:
        scenarios.cleanup(worker)


def _blocked_at_exit(
    exo_python: str, notes: Path, registry: Path
) -> tuple[scenarios.StartedWorker, ProcessIdentity]:
    """An `exofull` runner: its worker is SIGKILLed, its guard hands it its Shutdown,
    it floods its event stream, runs its shutdown and blocks in the join."""
    return _start("exofull", exo_python, notes, registry)


def test_a_runner_whose_exit_blocks_on_its_full_event_pipe_is_ended_within_the_bounds(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    worker, runner = _blocked_at_exit(exo_python, notes, isolated_environment)
    try:
        _write_marker(isolated_environment, worker)
        env = {
            "EXO_ORPHAN_GUARD_GRACE": str(FULL_GRACE),
            "EXO_ORPHAN_GUARD_BUSY_WAIT": str(BUSY_WAIT),
        }
        with guardian(isolated_environment, **env) as running:
            assert "hand themselves" in running.watching(worker.pid)
            killed_at = scenarios.kill_worker(worker)
            bound = FULL_GRACE + max(BUSY_WAIT, FULL_GRACE) + MARGIN
            gone_at = scenarios.wait_gone([runner], bound)[runner]
            assert gone_at is not None, running.lines
            # Not before the grace: no signal came sooner, and it did not exit by itself.
            assert gone_at - killed_at >= FULL_GRACE, "gone inside the grace"
            events = _events(notes, runner)
            joined = ["took", "flooded", "shut down", "joining"]
            assert events[:4] == joined, (events, running.lines)
            assert "joined" not in events
            line = ended_line(isolated_environment, runner)
            assert line is not None, running.lines
            # The join waits on a lock, which a signal interrupts: SIGINT unwinds it.
            assert (line.how, line.signal, line.step) == ("clean", "SIGINT", "interrupt")
    finally:
        scenarios.cleanup(worker)


def test_without_a_guardian_a_runner_blocked_on_its_full_event_pipe_stays_orphaned(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    """The control: its own Shutdown ran, and nothing inside the runner ends it."""
    worker, runner = _blocked_at_exit(exo_python, notes, isolated_environment)
    try:
        scenarios.kill_worker(worker)
        wait_for_note(notes, runner.pid, "joining")
        assert not wait_until(lambda: liveness(runner) == "gone", 3.0)
        assert _events(notes, runner) == ["took", "flooded", "shut down", "joining"]
    finally:
        scenarios.cleanup(worker)
