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

HANG_FACTOR = 2.0
"""The next group without the guard is given this many times as long to form as the
one with the guard took (at least `HANG_FLOOR_SECONDS`): it hangs, so it never does."""
HANG_FLOOR_SECONDS = 3.0


def test_guard_on_the_next_group_forms_guard_off_it_hangs(tmp_path: Path) -> None:
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    guarded = ring_scenario.orphan_then_next_group(
        guard=True, timeout=20.0, scratch=tmp_path / "on"
    )
    assert guarded.orphan_gone_ms is not None  # how soon: `make demo` and `make bench`
    assert guarded.formed and guarded.sums == {0: 3.0, 1: 3.0}
    # The control waits as long as the guarded group took, and then some.
    bound = max(HANG_FACTOR * guarded.form_seconds, HANG_FLOOR_SECONDS)
    unguarded = ring_scenario.orphan_then_next_group(
        guard=False, timeout=bound, scratch=tmp_path / "off"
    )
    assert unguarded.orphan_gone_ms is None, "without the guard the rank should outlive its worker"
    assert not unguarded.formed
    # The new rank 1 joined the orphan instead; the new rank 0 waits forever.
    assert 0 not in unguarded.sums
