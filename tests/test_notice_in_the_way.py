"""A runner whose notice signal was taken over below Python (`faulthandler.register`, the
usual "dump my stacks" hook) or blocked is found out at notice time and told another
way: idle in Python, it ends the clean way within the usual bound, far from the busy
wait it used to be killed at ("busy in native code for 5.0 s (GIL free)"), and its
ending says what stood in the way. The limit: a main thread asleep in one long call
with the signal blocked cannot be woken; it is killed at the busy wait, and the record
says why. Real processes, SIGKILLed workers, the watchdog's endings read back. The
parts, by injection: tests/test_notice_check.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.system import settings
from tests.conftest import StartWorker
from tests.test_busy_ending import kill_when_noted
from tests.test_clean_ending import end_worker

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

BUSY_WAIT = 5.0
"""Long: a runner the notice did not reach would be killed only then."""
GRACE = 4.0


@pytest.fixture(autouse=True)
def bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.GRACE_ENV, str(GRACE))
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(BUSY_WAIT))


@pytest.mark.parametrize("kind", ["dumps", "dumpsread", "dumpslow"])
def test_an_idle_runner_whose_notice_faulthandler_took_ends_clean_and_says_so(
    start_worker: StartWorker, notes: Path, isolated_environment: Path, kind: RunnerKind
) -> None:
    """Asleep in Python (`dumps`), or in a `read` of a pipe, as a runner waiting for its
    next task is, which faulthandler's handler restarts (`dumpsread`): only the
    signal's own handler, put back, interrupts that one. `dumpslow`: faulthandler's
    handler is still in its dump when the notice is sent again, so the `read` is
    restarted after both handlers ran; only a later notice interrupts it."""
    ended = end_worker(
        start_worker, [kind, "idle"], notes, isolated_environment, bound=BUSY_WAIT + 2.0
    )
    after = ended.after[kind]
    assert after is not None, "the runner was left alive"
    # Reached by the notice (`dumpslow` by a later one, at most 1.55 s after the first),
    # not killed at the busy wait. How soon is `make bench`'s figure, not a test's.
    assert after < BUSY_WAIT, (after, ended.ending(kind))
    assert ended.notes[kind] == ["raised", "finally"], ended.notes  # WorkerGone, unwound
    ending = ended.ending(kind)
    assert ending.how == "clean", ending
    assert ending.why == (
        "it exited by itself after its worker died; its notice signal SIGUSR1 had been "
        "taken over below Python (faulthandler.register?): put back, and sent again"
    ), ending
    # Beside it, a runner whose notice nothing stood in the way of says nothing more.
    assert ended.ending("idle").why == "it exited by itself after its worker died"


def test_an_idle_runner_that_blocks_its_notice_ends_clean_and_says_so(
    start_worker: StartWorker, notes: Path, isolated_environment: Path
) -> None:
    """Blocked from before its guard was armed, so in every thread: no thread can take
    the signal, and only the notice without one (interrupt_main) reaches it."""
    ended = end_worker(start_worker, ["masked"], notes, isolated_environment, bound=BUSY_WAIT + 2.0)
    after = ended.after["masked"]
    assert after is not None, "the runner was left alive"
    assert after < BUSY_WAIT, (after, ended.ending("masked"))
    assert ended.notes["masked"] == ["raised", "finally"], ended.notes
    ending = ended.ending("masked")
    assert ending.how == "clean", ending
    assert ending.why == (
        "it exited by itself after its worker died; its notice signal SIGUSR1 was blocked "
        "on its main thread: told without it (interrupt_main), which that thread takes "
        "once it runs Python"
    ), ending


def test_a_runner_asleep_in_one_call_with_its_notice_blocked_is_killed_at_the_busy_wait(
    start_worker: StartWorker,
    notes: Path,
    isolated_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The limit: nothing wakes a sleep with the signal blocked. The record says why."""
    busy_wait = 2.0
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(busy_wait))
    # Killed once it sleeps: until then it runs Python, which takes the notice.
    ended, _ = kill_when_noted(start_worker, "maskedsleep", notes, isolated_environment, "asleep")
    after = ended.after["maskedsleep"]
    assert after is not None, "the runner was left alive"
    assert after >= busy_wait, (after, ended.notes, ended.endings)  # not before it
    ending = ended.ending("maskedsleep")
    assert ending.how == "killed", ending
    blocked = (
        "; its notice signal SIGUSR1 was blocked on its main thread: told without it "
        "(interrupt_main), which that thread takes once it runs Python"
    )
    assert ending.why == f"busy in native code for {busy_wait:.1f} s (GIL free){blocked}", ending
    busy = ended.busy_lines("maskedsleep")
    assert busy and busy[0].why == f"busy in native code, GIL free{blocked}", busy
