"""The clean ending on real processes, where something in the runner stands in its
way: the notice landing while the main thread holds a loguru sink's lock, or once the
interpreter's exit is under way; a thread logging toward the dead worker while the
main thread is in native code. Each test fails on the code before its fix (named in
its docstring)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.ending_hazards import EXIT_STEPS, THREAD_LINE, THREAD_STEPS
from exo_orphan_guard.rig.notes import read_notes, read_stderr
from exo_orphan_guard.system import settings
from exo_orphan_guard.watch.worker_gone import WorkerGone
from tests.conftest import StartWorker
from tests.test_clean_ending import CLEAN_BOUND, GRACE, Ended

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

_READY_SECONDS = 10.0


@pytest.fixture
def graced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(settings.GRACE_ENV, str(GRACE))
    yield


def wait_for_note(notes: Path, pid: int, event: str) -> None:
    """Until runner `pid` has noted `event`: it is where the test wants it."""
    deadline = time.monotonic() + _READY_SECONDS
    while event not in [note["event"] for note in read_notes(notes, pid)]:
        assert time.monotonic() < deadline, f"runner {pid} never noted {event!r}"
        time.sleep(0.01)


@pytest.mark.usefixtures("graced")
def test_a_notice_that_lands_while_a_sink_holds_its_lock_still_ends_clean(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    """Issue 27 item 7. The handler used to log through loguru itself: landing inside
    the write of a sink added with `catch=False`, it made loguru raise "Could not
    acquire internal lock" in place of WorkerGone; the runner took it for one more
    failed step and went on, and was killed at the grace (before 038d12d)."""
    worker = start_worker(["slowsink"], notes=notes)
    runner = worker.runners[0].identity
    wait_for_note(notes, runner.pid, "logging")
    time.sleep(0.1)  # a few lines into the loop
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, GRACE + 1.5)
    written = read_notes(notes, runner.pid)
    assert [note for note in written if note["event"] == "logging failed"] == []
    assert ended.notes["slowsink"] == ["logging", "raised", "finally"], written
    assert written[1]["type"] == WorkerGone.__name__
    after = ended.after["slowsink"]
    assert after is not None and after < CLEAN_BOUND, after
    ending = ended.ending("slowsink")
    assert ending.how == "clean", ending


@pytest.mark.usefixtures("graced")
@pytest.mark.parametrize(
    ("moment", "step"), [("thread step", 2), ("exit step", 3)], ids=["joining", "atexit"]
)
def test_a_worker_that_dies_during_the_runners_exit_lets_it_finish(
    start_worker: StartWorker, notes: Path, isolated_environment: Path, moment: str, step: int
) -> None:
    """Issue 27 item 5. The runner's main function has returned: the interpreter joins
    a non-daemon thread, then runs an atexit hook, both with steps left, when the
    worker dies. Before 038d12d the first WorkerGone was raised there all the same: out
    of the join (its traceback on stderr, the exit no longer clean) or out of the hook
    ("Exception ignored in atexit callback", its steps cut short)."""
    worker = start_worker(["exit"], notes=notes)
    runner = worker.runners[0].identity
    scenarios.ask_to_shut_down(worker)
    deadline = time.monotonic() + _READY_SECONDS
    while not any(
        note["event"] == moment and note["step"] == step for note in read_notes(notes, runner.pid)
    ):
        assert time.monotonic() < deadline, f"the runner never noted {moment} {step}"
        time.sleep(0.005)
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, GRACE + 1.5)
    events = ended.notes["exit"]
    assert events.count("thread step") == THREAD_STEPS and "thread finally" in events, events
    assert events.count("exit step") == EXIT_STEPS and events[-1] == "exit done", events
    assert "raised" not in events  # no WorkerGone: the main function had returned
    stderr = read_stderr(notes, runner.pid)
    assert "Exception ignored" not in stderr and WorkerGone.__name__ not in stderr, stderr
    ending = ended.ending("exit")
    assert ending.how == "clean", ending


@pytest.mark.usefixtures("graced")
def test_a_thread_logging_to_the_dead_worker_does_not_hold_up_a_busy_runner(
    start_worker: StartWorker,
    notes: Path,
    isolated_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27 item 6. A non-daemon thread logs through the worker's enqueued sink
    while the main thread is in a GIL-free native call. Before the fix the sink's writes
    were dropped only from the main thread's handler: by the time the call returned the
    thread was blocked for good on the full pipe, the exit's join waited on it, and the
    runner was killed at the grace."""
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, "30")
    worker = start_worker(["logthread"], notes=notes, extra_env={"EOG_NATIVE_SECONDS": "2"})
    runner = worker.runners[0].identity
    wait_for_note(notes, runner.pid, "native begun")
    scenarios.kill_worker(worker)
    ended = Ended(worker, notes, isolated_environment, 2.0 + GRACE + 1.5)
    events = ended.notes["logthread"]
    assert {"raised", "thread finally", "finally"} <= set(events), events
    (finished,) = [
        note for note in read_notes(notes, runner.pid) if note["event"] == "thread finally"
    ]
    assert finished["lines"] * len(THREAD_LINE) > 2 * 2**16  # more than the pipe holds
    after = ended.after["logthread"]
    assert after is not None and after < 2.0 + CLEAN_BOUND, after
    ending = ended.ending("logthread")
    assert ending.how == "clean", ending
