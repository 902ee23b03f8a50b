"""The deciding half of the one engine every ending goes through: which step each
target gets, and when (`engine.begin`, `engine.advance`), and how a judged target is
planned (`sweep_endings.plan`). Pure: made-up targets, times and verdicts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from exo_orphan_guard.records.endings import Ending
from exo_orphan_guard.sweeper.engine import (
    EXIT_SETTLE_SECONDS,
    FirstStep,
    Progress,
    Target,
    advance,
    begin,
)
from exo_orphan_guard.sweeper.sweep_endings import Bounds, plan
from exo_orphan_guard.sweeper.verdicts import Verdict
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.snapshots import proc

RUNNER = ProcessIdentity(Pid(42), 100.0)
SIGINT_STEP = FirstStep("SIGINT", 120.0)
KILL_WAIT = 2.0
BOUNDS = Bounds(grace=10.0, interrupt_wait=120.0, kill_wait=KILL_WAIT)


def _advance(target: Target, progress: Progress, now: float, **seen: Any) -> tuple[Progress, str]:
    return advance(
        target, progress, gone=seen.pop("gone", False), now=now, kill_wait=KILL_WAIT, **seen
    )


def test_a_target_ending_by_itself_is_left_alone_until_its_deadline() -> None:
    target = Target(RUNNER, SIGINT_STEP, left_alone_until=10.0)
    progress, move = begin(target, now=0.0)
    assert (progress, move) == (Progress("left_alone", 10.0), "wait")
    assert _advance(target, progress, 5.0) == (progress, "wait")
    # Out of time: its first step, with the busy wait from now.
    assert _advance(target, progress, 10.0) == (Progress("signalled", 130.0), "first_signal")


def test_a_renewed_deadline_keeps_it_alone_and_a_stale_one_does_not() -> None:
    target = Target(RUNNER, SIGINT_STEP, left_alone_until=10.0)
    alone = Progress("left_alone", 10.0)
    assert _advance(target, alone, 10.0, renewed=25.0) == (Progress("left_alone", 25.0), "wait")
    assert _advance(target, alone, 10.0, renewed=9.0)[1] == "first_signal"


def test_one_gone_while_left_alone_gets_nothing() -> None:
    target = Target(RUNNER, SIGINT_STEP, left_alone_until=10.0)
    assert _advance(target, Progress("left_alone", 10.0), 3.0, gone=True)[1] == "done"


def test_stopping_leaves_what_is_left_alone_and_finishes_what_was_begun() -> None:
    target = Target(RUNNER, SIGINT_STEP)
    assert _advance(target, Progress("left_alone", 10.0), 3.0, stopping=True) == (
        Progress("left", 3.0),
        "leave",
    )
    signalled = Progress("signalled", 130.0, delivered=True)
    assert _advance(target, signalled, 3.0, stopping=True) == (signalled, "wait")
    assert _advance(target, signalled, 130.0, stopping=True)[1] == "kill"


def test_a_first_signal_that_did_not_get_through_is_sent_again_until_the_deadline() -> None:
    target = Target(RUNNER, SIGINT_STEP)
    progress, move = begin(target, now=0.0)
    assert move == "first_signal" and not progress.delivered
    assert _advance(target, progress, 0.01)[1] == "first_signal"
    assert _advance(target, replace(progress, delivered=True), 0.01)[1] == "wait"
    assert _advance(target, progress, 120.0) == (Progress("killed", 122.0), "kill")


@pytest.mark.parametrize("now", [122.0, 200.0])
def test_after_sigkill_it_is_waited_for_only_the_kill_wait(now: float) -> None:
    target = Target(RUNNER, SIGINT_STEP)
    killed = Progress("killed", 122.0)
    assert _advance(target, killed, 121.0) == (killed, "wait")
    assert _advance(target, killed, now)[1] == "done"
    assert _advance(target, killed, 121.0, gone=True)[1] == "done"


def test_one_on_its_way_out_after_sigkill_is_waited_for_longer() -> None:
    """A loaded machine can take seconds to tear a process down: not stuck in the
    kernel, it is given `EXIT_SETTLE_SECONDS` more before it is called unkillable."""
    target = Target(RUNNER, SIGINT_STEP)
    killed = Progress("killed", 122.0)
    assert _advance(target, killed, 123.0, exiting=True) == (killed, "wait")
    assert _advance(target, killed, 122.0 + EXIT_SETTLE_SECONDS, exiting=True)[1] == "done"
    assert _advance(target, killed, 123.0, exiting=False)[1] == "done"


def test_no_first_step_is_sigkill_at_once() -> None:
    assert begin(Target(RUNNER, FirstStep("SIGTERM", 0.0)), now=5.0) == (
        Progress("killed", 5.0),
        "kill",
    )


# --- planning judged targets -------------------------------------------------------


def _verdict(pid: int, rule: Any = "fingerprint") -> Verdict:
    return Verdict(Pid(pid), "kill", "why", rule, proc(pid))


def _begun(target: ProcessIdentity, deadline: float, by: Any = "guardian") -> Ending:
    return Ending("begun", target.pid, target.started, "boot", 0.0, by, deadline=deadline)


def test_an_exo_runner_gets_sigint_and_the_busy_wait_anything_else_sigterm() -> None:
    planned = plan([_verdict(10), _verdict(11, "match")], {}, 0.0, BOUNDS)
    assert [target.first for target in planned] == [
        FirstStep("SIGINT", 120.0),
        FirstStep("SIGTERM", 10.0),
    ]
    assert all(target.left_alone_until is None for target in planned)


def test_one_handed_its_own_shutdown_is_left_alone_for_the_handover() -> None:
    runner = proc(10).identity
    (target,) = plan([_verdict(10)], {}, 50.0, BOUNDS, handed={runner}, handover_wait=10.0)
    assert target.left_alone_until == 60.0


def test_one_another_sweeper_began_to_end_waits_for_it_unless_told_not_to() -> None:
    runner = proc(10).identity
    latest = {runner: _begun(runner, deadline=80.0)}
    (target,) = plan([_verdict(10)], latest, 50.0, BOUNDS, handed={runner}, handover_wait=10.0)
    assert target.left_alone_until == 80.0  # its deadline, over the hand-over's
    (now,) = plan([_verdict(10)], latest, 50.0, BOUNDS, wait_for_endings=False)
    assert now.left_alone_until is None


def test_spared_verdicts_are_never_targets() -> None:
    spared = Verdict(Pid(12), "spare", "its worker lives", None, proc(12))
    assert plan([spared], {}, 0.0, BOUNDS) == []
