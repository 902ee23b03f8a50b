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
