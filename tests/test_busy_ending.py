"""A runner busy in native code when its worker dies is busy, not wedged: it is waited
for until its call returns to Python, then ends the clean way, within the busy wait
(`EXO_ORPHAN_GUARD_BUSY_WAIT`); only one still in native code at that bound is
killed, and its ending says so, with the GIL held or free. `WorkerGone` is raised
again until the runner exits, so a bare `except:` cannot keep it alive; a flood of
logs into the dead worker's loguru queue does not block it; a watchdog that fails
still kills a runner holding the GIL. Real processes, SIGKILLed workers, the
watchdog's endings read back from the registry."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from exo_orphan_guard.rig import ring_scenario, scenarios
from exo_orphan_guard.rig.native_calls import GIL_BUSY_SECONDS
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.system import settings
from tests.conftest import StartWorker
from tests.helpers.waiting import wait_for_note
from tests.test_clean_ending import Ended

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

GRACE = 4.0
BUSY_WAIT = 3.0
"""Small, so that a runner that never returns is killed soon."""


@pytest.fixture(autouse=True)
def bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.GRACE_ENV, str(GRACE))
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(BUSY_WAIT))


def kill_when_noted(
    start_worker: StartWorker, kind: RunnerKind, notes: Path, registry: Path, event: str
) -> tuple[Ended, dict[str, Any]]:
    """Start a runner, SIGKILL its worker right after the runner notes `event` (and a
    little more: inside the call it announced), and see how the runner ended."""
    worker = start_worker([kind], notes=notes)
    runner = worker.runners[0].identity
    wait_for_note(
        notes,
        runner.pid,
        event,
        60.0,
        where=None if kind != "mlxbusy" else lambda note: note["sized"],
    )
    time.sleep(0.2)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, registry, 60.0)
    (note,) = [note for note in read_notes(notes, runner.pid) if note["event"] == event][-1:]
    return ended, note


def events(ended: Ended, kind: RunnerKind) -> list[str]:
    return ended.notes[kind]


def noted_at(notes: Path, ended: Ended, kind: RunnerKind, event: str) -> float:
    (at,) = [
        note["at"] for note in read_notes(notes, ended.by_kind[kind].pid) if note["event"] == event
    ]
    return at


def _eval_seconds(noted: list[dict[str, Any]]) -> list[float]:
    """How long each eval the runner saw return lasted."""
    seconds: list[float] = []
    began: float | None = None
    for note in noted:
        if note["event"] == "eval begun":
            began = float(note["at"])
        elif note["event"] == "eval returned" and began is not None:
            seconds.append(float(note["at"]) - began)
            began = None
    return seconds


@pytest.mark.skipif(not ring_scenario.mlx_available(), reason="needs mlx[cpu]")
def test_a_runner_inside_one_long_mx_eval_ends_clean_after_it_returns(
    start_worker: StartWorker,
    notes: Path,
    isolated_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, "60")  # longer than any eval here, loaded too
    ended, begun = kill_when_noted(
        start_worker, "mlxbusy", notes, isolated_environment, "eval begun"
    )
    raised = noted_at(notes, ended, "mlxbusy", "raised")
    # WorkerGone came once the eval returned: long after the old 0.5 s bound, and about
    # as long after it began as the runner's earlier evals lasted (each is sized from a
    # timed one, so a machine that quietens meanwhile makes them shorter than sized).
    evals = _eval_seconds(read_notes(notes, ended.by_kind["mlxbusy"].pid))
    assert evals, ended.notes
    took = raised - begun["at"]
    assert took >= max(1.0, 0.75 * min(evals)), (took, evals, ended.notes)
    after = ended.after["mlxbusy"]
    assert after is not None, "the runner was left alive"
    assert events(ended, "mlxbusy")[-3:] == ["raised", "finally", "exit"], ended.notes
    at_exit = read_notes(notes, ended.by_kind["mlxbusy"].pid)[-1]
    assert (at_exit["active"], at_exit["cache"]) == (0, 0), at_exit
    ending = ended.ending("mlxbusy")
    assert ending.how == "clean" and ending.by == "watchdog", ending
    busy = ended.busy_lines("mlxbusy")
    assert busy and all(line.gil == "free" for line in busy), busy


def test_native_code_holding_the_gil_with_every_signal_blocked_ends_clean_once_it_returns(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    ended, begun = kill_when_noted(
        start_worker, "gilbusy", notes, isolated_environment, "native begun"
    )
    returned = begun["at"] + GIL_BUSY_SECONDS
    raised = noted_at(notes, ended, "gilbusy", "raised")
    # Not inside the call: once it returned (how soon after is `make bench`'s figure).
    assert raised >= returned - 0.05, (raised - begun["at"], ended.notes)
    assert events(ended, "gilbusy")[-2:] == ["raised", "finally"], ended.notes
    ending = ended.ending("gilbusy")
    assert ending.how == "clean", ending
    busy = ended.busy_lines("gilbusy")
    assert busy and all(line.gil == "held" for line in busy), busy


@pytest.mark.parametrize("kind", ["gil", "deaf"])
def test_native_code_that_never_returns_is_killed_at_the_busy_wait_not_before(
    start_worker: StartWorker, notes: Path, isolated_environment: Path, kind: RunnerKind
) -> None:
    worker = start_worker([kind], notes=notes)
    time.sleep(scenarios.GIL_SETTLE_SECONDS)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, BUSY_WAIT + 2.0)
    after = ended.after[kind]
    assert after is not None, "the runner was left alive"
    assert after >= BUSY_WAIT, after  # not before the busy wait; at it, says the why
    assert ended.notes[kind] == []
    ending = ended.ending(kind)
    assert ending.how == "killed", ending
    assert ending.why == f"busy in native code for {BUSY_WAIT:.1f} s (GIL held)", ending


def test_a_bare_except_that_swallows_worker_gone_still_ends_cleanly_before_the_grace(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    worker = start_worker(["swallow"], notes=notes)
    wait_for_note(notes, worker.runners[0].identity.pid, "swallowing", 60.0)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, GRACE + 2.0)
    assert ended.notes["swallow"] == ["swallowing", "swallowed", "raised", "finally"], ended.notes
    after = ended.after["swallow"]
    assert after is not None  # raised again at 1 s, and clean: before the grace
    assert ended.ending("swallow").how == "clean"


def test_a_log_flood_into_the_dead_workers_loguru_queue_ends_cleanly(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    """exo's `logger_setup`: a loguru sink with `enqueue=True`, whose pipe only the dead
    worker read and whose other end the runner holds: more than 1 MiB logged after
    the death must not block the ending."""
    worker = start_worker(["loguru"], notes=notes)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, GRACE + 2.0)
    assert ended.notes["loguru"] == ["raised", "caught", "logged", "done", "finally"], ended.notes
    logged = read_notes(notes, ended.by_kind["loguru"].pid)[2]
    assert logged["bytes"] >= 2**20
    after = ended.after["loguru"]
    assert after is not None
    assert ended.ending("loguru").how == "clean"  # so before the grace


def test_a_watchdog_that_fails_still_kills_a_runner_holding_the_gil_and_says_why(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    worker = start_worker(["faulty"], notes=notes)
    time.sleep(scenarios.GIL_SETTLE_SECONDS)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, BUSY_WAIT + 2.0)
    after = ended.after["faulty"]
    assert after is not None and after < BUSY_WAIT, after  # at once, not at the busy wait
    ending = ended.ending("faulty")
    assert ending.how == "killed" and "its watchdog failed (RuntimeError" in ending.why, ending
