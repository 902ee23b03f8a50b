"""A real MLX distributed group (ring backend over loopback) after an orphan.

The orphan: rank 0 of a group whose worker was SIGKILLed while the rank sat inside
`mx.distributed.init()` holding the GIL. Without the guard the next group on the same
ports hangs; with it, the orphan is gone and the next group returns the right sum.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_orphan_guard.rig import ring_scenario

pytestmark = pytest.mark.skipif(
    not ring_scenario.mlx_available(), reason="needs mlx[cpu] (a test dependency on Linux)"
)


def test_guard_off_the_orphan_in_init_makes_the_next_group_hang(tmp_path: Path) -> None:
    outcome = ring_scenario.orphan_then_next_group(guard=False, timeout=6.0, scratch=tmp_path)
    assert outcome.orphan_gone_ms is None, "without the guard the rank should outlive its worker"
    assert not outcome.formed
    # The new rank 1 joined the orphan instead; the new rank 0 waits forever.
    assert 0 not in outcome.sums


def test_guard_on_the_orphan_is_gone_and_the_next_group_forms(tmp_path: Path) -> None:
    outcome = ring_scenario.orphan_then_next_group(guard=True, timeout=20.0, scratch=tmp_path)
    assert outcome.orphan_gone_ms is not None and outcome.orphan_gone_ms < 1000
    assert outcome.formed and outcome.sums == {0: 3.0, 1: 3.0}
