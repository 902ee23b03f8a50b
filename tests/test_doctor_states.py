"""`ps -o stat=` shows `?` for a process it cannot inspect: unknown, not stuck, not fine."""

from __future__ import annotations

import dataclasses

from exo_orphan_guard.tools import doctor
from tests.test_doctor import HEALTHY


def unkillable(stuck: tuple[tuple[int, str], ...]) -> doctor.Check:
    checks = doctor.assess(dataclasses.replace(HEALTHY, stuck=stuck))
    return next(check for check in checks if check.name == "unkillable")


def test_an_uninspectable_state_is_a_warning_naming_the_pid() -> None:
    check = unkillable(((301, "?"),))
    assert check.status == "WARN" and "301" in check.detail and "unknown" in check.detail


def test_a_stuck_runner_still_fails_beside_an_unknown_one() -> None:
    check = unkillable(((300, "U"), (301, "?")))
    assert check.status == "FAIL" and "300 (U)" in check.detail
    assert "state unknown: 301" in check.detail


def test_nothing_stuck_is_ok() -> None:
    assert unkillable(()).status == "OK"


def reads(*states: str | None) -> tuple[list[str | None], list[float]]:
    """A stuck-state reader that answers `states` in turn, and the pauses taken."""
    answers = list(states)
    return answers, []


def test_a_moment_in_uninterruptible_sleep_is_not_stuck() -> None:
    answers, pauses = reads("D", None, None)
    state = doctor.lasting_stuck_state(1, read=lambda _pid: answers.pop(0), pause=pauses.append)
    assert state is None and pauses == [doctor.STUCK_READ_INTERVAL]


def test_a_state_that_lasts_every_read_is_stuck() -> None:
    answers, pauses = reads("D", "D", "D")
    state = doctor.lasting_stuck_state(1, read=lambda _pid: answers.pop(0), pause=pauses.append)
    assert state == "D" and len(pauses) == doctor.STUCK_READS - 1 and not answers


def test_a_process_never_stuck_is_read_once() -> None:
    answers, pauses = reads(None, "D")
    state = doctor.lasting_stuck_state(1, read=lambda _pid: answers.pop(0), pause=pauses.append)
    assert state is None and not pauses and answers == ["D"]
