"""A real MLX group (ring backend over loopback) whose ranks hold 256 MB each when
their worker is SIGKILLed: with the clean ending each rank gets WorkerGone on its
main thread, lets go of everything (MLX's active and cached memory are 0 at its very
exit), exits by itself well before the grace, and the next group forms on the same
ports. With grace 0 the ranks are killed at once, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_orphan_guard.rig import ring_scenario
from exo_orphan_guard.rig.ring_ending import GroupEnding, end_a_formed_group
from exo_orphan_guard.rig.ring_scenario import RankBehaviour

pytestmark = pytest.mark.skipif(
    not ring_scenario.mlx_available(), reason="needs mlx[cpu] (a test dependency on Linux)"
)

HOLD_MB = 256
GRACE = 10.0


def assert_ended_cleanly(ended: GroupEnding, *, caught: bool) -> None:
    for rank in ended.ranks:
        holding = rank.noted("holding")
        assert holding is not None and holding["active"] >= HOLD_MB * 2**20, rank.notes
        # Gone before the grace (how soon: `make bench`'s group section).
        assert rank.gone_after is not None and rank.gone_after < GRACE, rank
        raised = rank.noted("raised")
        assert raised is not None and raised["type"] == "WorkerGone", rank.notes
        assert (rank.noted("released") is not None) == caught, rank.notes
        assert rank.noted("finally") is not None, rank.notes
        at_exit = rank.noted("exit")
        assert at_exit is not None and (at_exit["active"], at_exit["cache"]) == (0, 0), at_exit
        assert rank.ending is not None and rank.ending.how == "clean", rank.ending
    assert ended.next_formed, "the next group did not form on the same ports"


@pytest.mark.parametrize(("then", "caught"), [("idle", False), ("loop", False), ("catch", True)])
def test_a_formed_group_ends_cleanly_and_the_next_one_forms(
    tmp_path: Path, then: RankBehaviour, caught: bool
) -> None:
    ended = end_a_formed_group(
        then=then, hold_mb=HOLD_MB, grace=GRACE, bound=GRACE + 2.0, scratch=tmp_path
    )
    assert_ended_cleanly(ended, caught=caught)


def test_with_grace_zero_the_ranks_are_killed_at_once(tmp_path: Path) -> None:
    ended = end_a_formed_group(then="idle", hold_mb=HOLD_MB, grace=0.0, bound=5.0, scratch=tmp_path)
    for rank in ended.ranks:
        # Long before the default grace would end it; at once, as its notes say.
        assert rank.gone_after is not None, rank
        assert rank.noted("raised") is None and rank.noted("exit") is None, rank.notes
        assert rank.ending is not None and rank.ending.how == "killed", rank.ending
    assert ended.next_formed
