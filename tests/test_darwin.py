"""macOS-only logic, fed by hand: this project's CI has no Mac."""

from __future__ import annotations

import pytest

from exo_orphan_guard import _darwin


@pytest.mark.parametrize(
    ("column", "state"),
    [("Us+\n", "U"), ("U", "U"), ("D+", "D"), ("Ss", None), ("R+", None), ("", None), ("Z", None)],
)
def test_ps_stat_column(column: str, state: str | None) -> None:
    assert _darwin.stuck_state_from_ps(column) == state


def test_stuck_state_asks_ps_for_the_pid() -> None:
    asked: list[int] = []

    def fake_ps(pid: int) -> str:
        asked.append(pid)
        return "Us+\n"

    assert _darwin.stuck_state(4242, run_ps=fake_ps) == "U"
    assert asked == [4242]
