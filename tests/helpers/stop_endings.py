"""Whether a guarded runner ended under exo's own stop as an unguarded one did.

exo's stop races each runner's own exit against its own SIGTERM: the supervisor joins
the runner for 3 s (5 s at v1.0.71) before it SIGTERMs it, and v1.0.71's leaving
process SIGTERMs its runners through multiprocessing's atexit. A runner that unwinds
within the join exits with its own code; the same runner on a loaded machine is
SIGTERMed before it is done. Which side a round lands on is exo's race, not the
guard's: a difference of exactly that kind is a `join race`, which the test settles
by playing both rounds again (a guard that kept its runner from exiting by itself
loses the race every time). A race the guarded runner won is no sign against the
guard once its exit is one the unguarded runner has shown too. Any other difference
is the guard's.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from tests.helpers.app_quit import RunnerEnd

JOIN_SECONDS = 3.0
"""exo's shortest join before its SIGTERM (main's `AsyncProcess`), from the stop: a
SIGTERM seen sooner is not the join running out."""
ATEXIT = "SIGTERM (multiprocessing's atexit)"

Comparison = Literal["same", "join race", "different"]


def compare(
    guarded: RunnerEnd, unguarded: RunnerEnd, unguarded_exits: Collection[str] = ()
) -> Comparison:
    """`guarded` against `unguarded`, the same runner's ending in the same stop;
    `unguarded_exits`: the exits (`exit N`) the unguarded runner showed in other
    rounds of the same stop."""
    if guarded.by != "exo" or unguarded.by != "exo":
        return "different"
    if guarded.how == unguarded.how:
        return "same"
    signalled = _signalled_of_a_pair(guarded, unguarded)
    if signalled is None or not lost_the_join_race(signalled):
        return "different"
    if signalled is unguarded and guarded.how in unguarded_exits:
        return "same"
    return "join race"


def lost_the_join_race(end: RunnerEnd) -> bool:
    """Whether exo's own SIGTERM, after its join or as it left, ended the runner."""
    if end.by != "exo":
        return False
    joined_out = end.gone_s is not None and end.gone_s >= JOIN_SECONDS
    return end.how == ATEXIT or (end.how == "SIGTERM" and joined_out)


def _signalled_of_a_pair(first: RunnerEnd, second: RunnerEnd) -> RunnerEnd | None:
    """The one exo SIGTERMed, where the other exited by itself."""
    for own, signalled in ((first, second), (second, first)):
        if own.how.startswith("exit ") and signalled.how in ("SIGTERM", ATEXIT):
            return signalled
    return None
