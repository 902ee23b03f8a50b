"""The first step of an exo runner's ending: exo's own Shutdown, handed to it on its
task stream (`exo.hooks`, `watch.handover`), with exo-shaped runners
(`rig.exo_runner`) whose worker is SIGKILLed. Which step ended each is read back from
the endings log: an idle runner takes the Shutdown; one that does not look at its
tasks within the window gets `WorkerGone`; one in a GIL-free native call shorter
than the window takes the Shutdown when it comes back; one holding the GIL for good
is killed at the busy wait."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.exo_runner import LOAD_SECONDS_ENV, OWN_SHUTDOWN_SECONDS
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.watch.handover import HANDOVER_SECONDS
from tests.conftest import StartWorker
from tests.test_clean_ending import Ended

# An exo runner sweeps the machine before its first task (`exo.hooks`): the tests that
# start one run only inside scripts/confined's pid namespace.
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")
machine_wide = pytest.mark.machine_wide

GRACE = 8.0
"""Twice the window and more: each step has room before the grace ends it."""
NATIVE_SECONDS = HANDOVER_SECONDS + 1.0
"""exoeval's one native call: longer than the window, which opens only once it returns."""
BUSY_WAIT = NATIVE_SECONDS + 1.5
"""A GIL held for good is killed then; the native call comes back before it."""


@pytest.fixture
def graced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(settings.GRACE_ENV, str(GRACE))
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(BUSY_WAIT))
    monkeypatch.setenv("EOG_NATIVE_SECONDS", str(NATIVE_SECONDS))
    yield


def _end(
    start_worker: StartWorker, kinds: list[scenarios.RunnerKind], notes: Path, registry: Path
) -> Ended:
    worker = start_worker(kinds, watch="exo", notes=notes)
    scenarios.kill_worker(worker)
    return Ended(worker, notes, registry, GRACE + 1.5)


@machine_wide
@pytest.mark.usefixtures("graced")
def test_each_exo_runner_ends_at_the_first_step_it_can_take(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    ended = _end(
        start_worker, ["exoidle", "exoload", "exoeval", "gil"], notes, isolated_environment
    )
    idle = ended.ending("exoidle")
    assert (idle.how, idle.step) == ("clean", "shutdown"), idle
    assert ended.notes["exoidle"] == ["took", "shut down", "finally"]
    after = ended.after["exoidle"]
    assert after is not None and after < OWN_SHUTDOWN_SECONDS + 0.7, after

    load = ended.ending("exoload")
    assert (load.how, load.step) == ("clean", "worker_gone"), load
    assert ended.notes["exoload"] == ["loading", "raised", "finally"]
    after = ended.after["exoload"]
    assert after is not None and HANDOVER_SECONDS <= after < HANDOVER_SECONDS + 1.0, after

    back = ended.ending("exoeval")
    assert (back.how, back.step) == ("clean", "shutdown"), back
    assert ended.notes["exoeval"][-3:] == ["took", "shut down", "finally"]

    wedged = ended.ending("gil")
    assert (wedged.how, wedged.step) == ("killed", "busy_wait"), wedged
    after = ended.after["gil"]
    assert after is not None and BUSY_WAIT <= after < BUSY_WAIT + 1.0, after


@machine_wide
@pytest.mark.usefixtures("graced")
def test_a_load_that_ends_within_the_window_takes_the_shutdown_after_it(
    start_worker: StartWorker,
    notes: Path,
    isolated_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LOAD_SECONDS_ENV, "0.8")
    ended = _end(start_worker, ["exoload"], notes, isolated_environment)
    load = ended.ending("exoload")
    assert (load.how, load.step) == ("clean", "shutdown"), load
    assert ended.notes["exoload"] == ["loading", "took", "shut down", "finally"]


def test_every_byte_on_the_runners_pipes_to_its_watchdog_means_one_thing() -> None:
    from exo_orphan_guard.watch import clean_ending, notice_check

    news = [
        clean_ending.BEGUN,
        clean_ending.SHUTTING_DOWN,
        clean_ending.SHELTER_LEFT,
        clean_ending.HEARTBEAT,
        clean_ending.HANDED_OVER,
        clean_ending.TAKEN,
        clean_ending.RAISED,
        *notice_check.NEWS,
    ]
    assert len(set(news)) == len(news), news


@machine_wide
@pytest.mark.usefixtures("graced")
def test_sigterm_from_a_live_worker_asks_an_exo_runner_for_its_own_shutdown(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    """exo stops a runner it no longer wants with SIGTERM (its own shutdown, EXO.app's
    quit). An idle exo runner takes its own Shutdown instead and exits by itself; one
    that does not look at its tasks within the window ends as SIGTERM would have."""
    worker = start_worker(["exoidle", "exoload"], watch="exo", notes=notes)
    by_kind = {runner.kind: runner.identity for runner in worker.runners}
    asked = time.monotonic()
    for identity in by_kind.values():
        os.kill(identity.pid, signal.SIGTERM)
    gone = scenarios.wait_gone(list(by_kind.values()), HANDOVER_SECONDS + 2.0)
    idle, load = gone[by_kind["exoidle"]], gone[by_kind["exoload"]]
    assert idle is not None and idle - asked < 1.0, idle
    assert read_events(notes, by_kind["exoidle"]) == ["took", "shut down", "finally"]
    assert load is not None and HANDOVER_SECONDS <= load - asked < HANDOVER_SECONDS + 1.0
    assert read_events(notes, by_kind["exoload"]) == ["loading"]  # no clean-up: a kill
    assert worker.process.poll() is None  # the worker lives on


def read_events(notes: Path, runner: ProcessIdentity) -> list[str]:
    return [str(note["event"]) for note in read_notes(notes, runner.pid)]


@machine_wide
@pytest.mark.usefixtures("graced")
def test_a_worker_that_dies_after_its_sigterm_leaves_the_ending_to_the_clean_one(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    """SIGTERM asked a runner that does not look at its tasks for its Shutdown, then its
    worker died: the SIGTERM's window running out must not kill what the worker's death
    began (WorkerGone, the runner's own `finally`), which its watchdog bounds."""
    worker = start_worker(["exoload"], watch="exo", notes=notes)
    (runner,) = worker.runners
    os.kill(runner.identity.pid, signal.SIGTERM)
    time.sleep(0.5)
    scenarios.kill_worker(worker)
    gone = scenarios.wait_gone([runner.identity], HANDOVER_SECONDS + 3.0)[runner.identity]
    assert gone is not None
    assert read_events(notes, runner.identity) == ["loading", "raised", "finally"]
