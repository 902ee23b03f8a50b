"""The guardian benchmark reads what a real guardian says: the wait after SIGINT in its
start-up line, which a `begun` line's deadline less is when the SIGINT went. When that
line changed (9d93534), `make bench --only guardian` failed on its first round, and
nothing in `make test` said so."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.guardian_process import READY, WATCH_TIMEOUT_S, GuardianProcess, guardian_environment
from bench.scan_variants import EveryCommandLine, Variant, guardian_command
from exo_orphan_guard.sweeper.judging import judge
from exo_orphan_guard.sweeper.verdicts import SweepOptions
from exo_orphan_guard.system import settings

# The guardian sweeps at its start: a real, machine-wide one.
pytestmark = pytest.mark.machine_wide


def test_the_bench_reads_the_wait_after_sigint_a_real_guardian_announces(tmp_path: Path) -> None:
    guardian = GuardianProcess(guardian_environment(tmp_path, tmp_path / "registry", "linux"))
    try:
        assert guardian.interrupt_wait() == settings.interrupt_bound(
            settings.DEFAULT_BUSY_WAIT_SECONDS, settings.DEFAULT_GRACE_SECONDS
        )
    finally:
        guardian.stop()


def test_todays_scan_in_the_bench_is_a_full_scan() -> None:
    """`bench.guardian_scan` sets today's scan beside the cheap one: it must judge as
    `judge` without candidates does."""
    options = SweepOptions(fingerprint=True)
    _, full = judge(None, options, [])
    _, today = judge(None, options, [], EveryCommandLine().candidates())
    assert [(v.pid, v.action, v.reason) for v in today] == [
        (v.pid, v.action, v.reason) for v in full
    ]


@pytest.mark.parametrize("variant", ["today", "unkept"])
def test_the_guardians_the_bench_compares_run(variant: Variant, tmp_path: Path) -> None:
    env = guardian_environment(tmp_path, tmp_path / "registry", "linux")
    guardian = GuardianProcess(env, guardian_command(variant))
    try:
        guardian.wait_for(READY, WATCH_TIMEOUT_S)
    finally:
        guardian.stop()
