"""exo's own parent watch alone (`exo_tree/.../runner/parent_watch.py`) in exo-shaped runners
(`rig.exo_runner`): when the worker is SIGKILLed, each runner is handed its own
Shutdown on its task stream and ends through its loop as soon as that loop looks at
its tasks: an idle runner at once, one in a long GIL-free native call once it
returns, one loading once its load is over. Nothing in the runner interrupts a
runner that never looks (that is the guardian's part, from outside), and while the
worker lives nothing changes: exo's SIGTERM keeps its default action.

No package code runs in these runners (the module never calls it), so no watchdog
and no endings record: the runners' own notes and the process table say what
happened."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.exo_runner import LOAD_SECONDS_ENV
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.system.identity import ProcessIdentity
from tests.conftest import StartWorker
from tests.helpers.waiting import wait_for_note

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

NATIVE_SECONDS = 2.0
"""exoeval's one GIL-free native call, as one long `mx.eval`."""


def read_events(notes: Path, runner: ProcessIdentity) -> list[str]:
    return [str(note["event"]) for note in read_notes(notes, runner.pid)]


def _killed(
    start_worker: StartWorker, kinds: list[scenarios.RunnerKind], notes: Path, wait: float
) -> tuple[dict[str, ProcessIdentity], dict[str, float | None]]:
    """Start exo-shaped runners, SIGKILL their worker, and say when each was gone
    (seconds after the kill; None: still there after `wait`)."""
    worker = start_worker(kinds, watch="exo", notes=notes)
    by_kind = {runner.kind: runner.identity for runner in worker.runners}
    killed_at = scenarios.kill_worker(worker)
    gone = scenarios.wait_gone(list(by_kind.values()), wait)
    after: dict[str, float | None] = {}
    for kind, identity in by_kind.items():
        at = gone[identity]
        after[kind] = None if at is None else at - killed_at
    return by_kind, after


def test_each_exo_runner_ends_through_its_own_shutdown_once_its_loop_looks(
    start_worker: StartWorker, notes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EOG_NATIVE_SECONDS", str(NATIVE_SECONDS))
    monkeypatch.setenv(LOAD_SECONDS_ENV, "1.0")
    by_kind, after = _killed(start_worker, ["exoidle", "exoeval", "exoload"], notes, 6.0)

    idle = after["exoidle"]
    # At once: before a native call as long as exoeval's could have returned (how soon
    # is `make bench`'s handover section).
    assert idle is not None and idle < NATIVE_SECONDS, idle
    assert read_events(notes, by_kind["exoidle"]) == ["took", "shut down", "finally"]

    back = after["exoeval"]
    assert back is not None, "the runner outlived its worker"
    assert read_events(notes, by_kind["exoeval"])[-3:] == ["took", "shut down", "finally"]

    load = after["exoload"]
    assert load is not None, "the runner outlived its worker"
    assert read_events(notes, by_kind["exoload"]) == ["loading", "took", "shut down", "finally"]


def test_a_runner_that_never_looks_at_its_tasks_is_not_interrupted_from_inside(
    start_worker: StartWorker, notes: Path
) -> None:
    """The module only hands the Shutdown over: a runner busy for good is left to the
    guardian outside (and killed here at teardown)."""
    by_kind, after = _killed(start_worker, ["exoload"], notes, 2.0)
    assert after["exoload"] is None
    assert read_events(notes, by_kind["exoload"]) == ["loading"]


def test_sigterm_from_a_live_worker_keeps_its_default_action_in_an_exo_runner(
    start_worker: StartWorker, notes: Path
) -> None:
    """exo stops a runner it no longer wants with SIGTERM: a guarded runner dies of it
    at once, as an unguarded one does (no handler, no Shutdown, no clean-up)."""
    worker = start_worker(["exoidle", "exoload"], watch="exo", notes=notes)
    by_kind = {runner.kind: runner.identity for runner in worker.runners}
    # Loading, as a runner exo no longer wants may be (else SIGTERM can come first).
    wait_for_note(notes, by_kind["exoload"].pid, "loading")
    asked = time.monotonic()
    for identity in by_kind.values():
        os.kill(identity.pid, signal.SIGTERM)
    gone = scenarios.wait_gone(list(by_kind.values()), 2.0)
    for kind, identity in by_kind.items():
        at = gone[identity]
        assert at is not None and at - asked < 0.5, (kind, at)
    assert read_events(notes, by_kind["exoidle"]) == []
    assert read_events(notes, by_kind["exoload"]) == ["loading"]
    assert worker.process.poll() is None  # the worker lives on


def test_every_byte_on_the_runners_pipes_to_its_watchdog_means_one_thing() -> None:
    from exo_orphan_guard.watch import clean_ending, notice_check

    news = [
        clean_ending.BEGUN,
        clean_ending.SHUTTING_DOWN,
        clean_ending.SHELTER_LEFT,
        clean_ending.HEARTBEAT,
        clean_ending.RAISED,
        *notice_check.NEWS,
    ]
    assert len(set(news)) == len(news), news
