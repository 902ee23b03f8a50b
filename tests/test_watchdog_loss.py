"""A runner is bounded whatever becomes of its watchdog (issue 27 item 1).

The watchdog is the part of the watch that needs no GIL. Killed while the worker
lives (the OOM killer, a user who takes it for a duplicate runner, runner code that
stops its own group), it used to leave the runner unbounded: a runner holding the GIL
in a call that never returns, or one whose bare `except:` swallowed the first
WorkerGone, outlived its worker for good. Each watchdog now keeps an understudy (a
fork of itself) that takes over, and ignores the stop signals a group gets.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from exo_orphan_guard import sweep, system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of, liveness
from tests.conftest import StartWorker
from tests.helpers.waiting import wait_for_note, wait_until
from tests.test_clean_ending import Ended

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

GRACE = 6.0
"""Generous: the runners that end the clean way must not be killed for being slow
(the swallowed WorkerGone comes again after 1 s; a loaded machine's teardown took
more than the 1 s left of a 2 s grace once)."""
BUSY_WAIT = 1.0
BOUND = BUSY_WAIT + GRACE + 1.5


@pytest.fixture(autouse=True)
def bounds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(settings.GRACE_ENV, str(GRACE))
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(BUSY_WAIT))
    yield


def children_of(parent: ProcessIdentity) -> list[ProcessIdentity]:
    found: list[ProcessIdentity] = []
    for pid in system.descendants(parent.pid):
        identity = identity_of(pid)
        if identity is not None and system.parent_pid(pid) == parent.pid:
            found.append(identity)
    return found


def understudy_of(watchdog: ProcessIdentity) -> ProcessIdentity:
    found: list[ProcessIdentity] = []
    assert wait_until(lambda: bool(found.extend(children_of(watchdog)) or found), 10.0)
    (understudy,) = found
    return understudy


def takeovers(registry: Path, runner: ProcessIdentity) -> list[endings.Ending]:
    path = host_directory(registry) / endings.ENDINGS_NAME
    return [
        ending
        for ending in endings.read(path, system.boot_id())
        if ending.identity == runner and ending.event == "watchdog"
    ]


def more_takeovers(registry: Path, runner: ProcessIdentity, than: int) -> bool:
    return len(takeovers(registry, runner)) > than


def kill_watchdog(registry: Path, runner: scenarios.StartedRunner, times: int = 1) -> None:
    """SIGKILL the runner's watchdog (and the one that took over, `times` over), each
    once its understudy stands by, and wait for the understudy to take over."""
    watchdog = runner.watchdog
    for _ in range(times):
        understudy = understudy_of(watchdog)
        before = len(takeovers(registry, runner.identity))
        os.kill(watchdog.pid, signal.SIGKILL)
        assert wait_until(partial(more_takeovers, registry, runner.identity, before), 5.0)
        assert liveness(understudy) == "alive"
        watchdog = understudy


def test_a_runner_whose_watchdog_was_killed_is_still_bounded(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    """The GIL-held runner is killed at the busy wait; the ones that can end the clean
    way (the swallowed WorkerGone comes again) do, as with their first watchdog."""
    worker = start_worker(["gil", "swallow", "idle"], notes=notes)
    wait_for_note(notes, worker.runners[1].identity.pid, "swallowing", 60.0)
    time.sleep(scenarios.GIL_SETTLE_SECONDS)  # the gil runner holds the GIL from now on
    for runner in worker.runners:
        kill_watchdog(isolated_environment, runner)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, BOUND)
    assert all(after is not None for after in ended.after.values()), ended.after
    gil = ended.ending("gil")
    assert gil.how == "killed" and gil.why.startswith("busy in native code"), gil
    for kind in ("swallow", "idle"):
        assert ended.ending(kind).how == "clean", ended.ending(kind)
        assert ended.notes[kind][-1] == "finally", ended.notes[kind]
    for runner in worker.runners:
        (line,) = takeovers(isolated_environment, runner.identity)
        assert "took over" in line.why


def test_a_watchdog_killed_again_and_again_is_taken_over_each_time(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    worker = start_worker(["gil"], notes=notes)
    (runner,) = worker.runners
    time.sleep(scenarios.GIL_SETTLE_SECONDS)
    kill_watchdog(isolated_environment, runner, times=3)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, BOUND)
    assert ended.after["gil"] is not None
    assert ended.ending("gil").how == "killed"
    assert len(takeovers(isolated_environment, runner.identity)) == 3


def test_an_understudy_that_dies_is_replaced(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    worker = start_worker(["gil"], notes=notes)
    (runner,) = worker.runners
    watchdog = runner.watchdog
    first = understudy_of(watchdog)
    os.kill(first.pid, signal.SIGKILL)
    replaced: list[ProcessIdentity] = []

    def replacement() -> bool:
        replaced[:] = [child for child in children_of(watchdog) if child != first]
        return bool(replaced)

    assert wait_until(replacement, 5.0)
    kill_watchdog(isolated_environment, runner)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, BOUND)
    assert ended.after["gil"] is not None and ended.ending("gil").how == "killed"


def test_a_stop_signal_to_the_runners_group_leaves_its_watchdog_standing(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    """As runner code that stops its own children with `os.killpg(0, SIGTERM)`: the
    runner (which here ignores it) and its watchdog stay; the worker's death still
    ends the runner."""
    worker = start_worker(["deaf"], notes=notes)
    (runner,) = worker.runners
    watchdog = runner.watchdog
    understudy = understudy_of(watchdog)
    time.sleep(scenarios.GIL_SETTLE_SECONDS)
    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(watchdog.pid, stop)
        os.kill(understudy.pid, stop)
    time.sleep(0.2)
    assert scenarios.alive([watchdog, understudy]) == [watchdog, understudy]
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, BOUND)
    assert ended.after["deaf"] is not None and ended.ending("deaf").how == "killed"
    assert takeovers(isolated_environment, runner.identity) == []


def test_the_watchdog_and_its_understudy_go_with_the_runner(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    """Nothing is left behind: not when the worker dies, not when exo stops the runner."""
    dying = start_worker(["idle"], notes=notes)
    stopped = start_worker(["idle"], notes=notes)
    helpers: list[ProcessIdentity] = []
    for worker in (dying, stopped):
        watchdog = worker.runners[0].watchdog
        helpers += [watchdog, understudy_of(watchdog)]
    scenarios.kill_worker(dying)
    os.kill(stopped.runners[0].identity.pid, signal.SIGTERM)  # exo's own stop
    gone = scenarios.wait_gone(helpers, 10.0)
    assert all(seen is not None for seen in gone.values()), gone


@pytest.mark.machine_wide
def test_a_sweep_spares_a_watchdog_that_took_over(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    """The understudy that took over is init's (its parent, the dead watchdog, is
    gone) and carries the runner's command line: to the fingerprint rule, an exo
    spawn child whose spawner is gone. In its live runner's group it is spared."""
    worker = scenarios.start_worker(
        ["idle"], python=exo_python, registry=isolated_environment, notes=notes
    )
    try:
        (runner,) = worker.runners
        understudy = understudy_of(runner.watchdog)
        kill_watchdog(isolated_environment, runner)
        assert wait_until(lambda: system.parent_pid(understudy.pid) != runner.watchdog.pid, 5.0)
        report = sweep(grace=0.2)
        assert scenarios.alive([runner.identity, understudy]) == [runner.identity, understudy]
        (verdict,) = [verdict for verdict in report.verdicts if verdict.pid == understudy.pid]
        assert verdict.action == "spare" and "a fork of it" in verdict.reason, verdict
        # And it still does its work.
        scenarios.kill_worker(worker)
        ended = Ended(worker, notes, isolated_environment, BOUND)
        assert ended.after["idle"] is not None and ended.ending("idle").how == "clean"
    finally:
        scenarios.cleanup(worker)


def test_the_runner_says_in_one_line_that_its_watchdog_was_taken_over(
    start_worker: StartWorker,
    notes: Path,
    isolated_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EOG_SCENARIO_STDERR", "1")  # the runners' stderr is this test's
    worker = start_worker(["idle"], notes=notes)
    (runner,) = worker.runners
    kill_watchdog(isolated_environment, runner)
    said: list[str] = []

    def logged() -> bool:
        said.extend(
            line for line in capfd.readouterr().err.splitlines() if "understudy took" in line
        )
        return bool(said)

    assert wait_until(logged, 5.0), "the runner did not log the takeover"
    assert len(said) == 1 and f"runner {runner.identity.pid}" in said[0], said
