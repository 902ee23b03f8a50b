"""The rule that tells exo's own join race from a guard that changed a runner's ending
(`helpers/stop_endings.py`, used by `test_exo_unchanged.py`), on made-up endings."""

from __future__ import annotations

import pytest

from tests.helpers.app_quit import RunnerEnd
from tests.helpers.stop_endings import ATEXIT, Comparison, compare, lost_the_join_race


def _end(how: str, gone_s: float | None = 1.0, by: str = "exo") -> RunnerEnd:
    return RunnerEnd("idle", 4242, gone_s, by, how)


@pytest.mark.parametrize(
    ("guarded", "unguarded", "expected"),
    [
        (_end("exit 0"), _end("exit 0", 2.0), "same"),
        (_end("SIGTERM", 3.4), _end("SIGTERM", 3.1), "same"),
        # The runner still unwinding when exo's join ran out, either way round.
        (_end("SIGTERM", 3.39), _end("exit 0", 2.9), "join race"),
        (_end("exit 1", 2.95), _end("SIGTERM", 3.22), "join race"),
        (_end(ATEXIT, 0.3), _end("exit 1", 0.2), "join race"),
        # A SIGTERM before any join could run out is not exo's stop.
        (_end("SIGTERM", 1.2), _end("exit 0", 0.9), "different"),
        # Another clean ending: exo's Shutdown where a KeyboardInterrupt was.
        (_end("exit 0"), _end("exit 1"), "different"),
        (_end("SIGKILL", 8.1), _end("exit 0"), "different"),
        (_end("exit 0"), _end("SIGKILL", 8.1), "different"),
        (_end("ended (SIGINT, SIGINT)", by="guardian"), _end("exit 0"), "different"),
        (_end("alive", None, by="orphaned"), _end("alive", None, by="orphaned"), "different"),
        (_end("exit 0"), _end("exit 0", by="guardian"), "different"),
    ],
)
def test_only_exos_own_race_passes_for_the_same_ending(
    guarded: RunnerEnd, unguarded: RunnerEnd, expected: Comparison
) -> None:
    assert compare(guarded, unguarded) == expected


@pytest.mark.parametrize(
    ("guarded", "unguarded", "expected"),
    [
        # The guarded runner won the race, with an exit the unguarded one has shown.
        (_end("exit 0", 2.9), _end("SIGTERM", 3.4), "same"),
        (_end(ATEXIT, 0.3), _end("exit 0", 0.2), "join race"),
        # It lost it: only a round it wins shows its own exit.
        (_end("SIGTERM", 3.4), _end("exit 0", 2.9), "join race"),
        # Its exit is not one the unguarded runner has shown.
        (_end("exit 1", 2.9), _end("SIGTERM", 3.4), "join race"),
        # Still no race: a SIGTERM before the join could run out.
        (_end("exit 0", 0.9), _end("SIGTERM", 1.2), "different"),
    ],
)
def test_a_won_race_counts_once_the_unguarded_runner_showed_that_exit(
    guarded: RunnerEnd, unguarded: RunnerEnd, expected: Comparison
) -> None:
    assert compare(guarded, unguarded, unguarded_exits={"exit 0"}) == expected


@pytest.mark.parametrize(
    ("end", "lost"),
    [
        (_end("SIGTERM", 3.2), True),
        (_end(ATEXIT, 0.1), True),
        (_end("SIGTERM", 1.2), False),
        (_end("exit 0", 3.2), False),
        (_end("SIGKILL", 9.0), False),
        (_end("killed (busy_wait, SIGKILL)", 9.0, by="guardian"), False),
    ],
)
def test_a_runner_lost_the_join_race_only_to_exos_own_sigterm(end: RunnerEnd, lost: bool) -> None:
    assert lost_the_join_race(end) is lost
