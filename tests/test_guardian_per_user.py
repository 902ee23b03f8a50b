"""One guardian per user and machine, whatever the environment: a guardian or sweep
configured otherwise (another EXO_HOME, XDG_CACHE_HOME, EXO_ORPHAN_GUARD_DIR, as a
launchd or systemd service gets beside exo's shell or app) finds the same lock and
the same record of begun endings (`records.user_dir`). Real guardians, a real sweep,
stand-in exo workers really SIGKILLed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.rig import notes as runner_notes
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import settings
from tests.helpers.guardian import RunningGuardian, guardian
from tests.helpers.waiting import wait_until

pytestmark = [
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc"),
]


def _elsewhere(tmp_path: Path) -> dict[str, str]:
    """Another environment of the same user: every variable that moved the registry."""
    home = tmp_path / "home-b"
    home.mkdir()
    return {
        **os.environ,
        "HOME": str(home),
        settings.EXO_HOME_ENV: "exo-b",
        settings.XDG_CACHE_ENV: str(tmp_path / "cache-b"),
        settings.DIR_ENV: str(tmp_path / "registry-b"),
    }


@pytest.mark.parametrize(("mode", "said"), [("service", "waiting to take over"), ("worker", "")])
def test_a_guardian_configured_otherwise_does_not_guard_beside_the_first(
    isolated_environment: Path, tmp_path: Path, mode: str, said: str
) -> None:
    """Before, each took the lock of its own registry and both guarded: both SIGINTed
    the same runner, the second cutting the first one's unwinding short."""
    with guardian(isolated_environment) as first:
        second = RunningGuardian(_elsewhere(tmp_path), "--mode", mode)
        try:
            line = second.wait_for("another guardian holds")
            assert str(isolated_environment) not in line and "registry-b" not in line, line
            if mode == "worker":
                assert second.process.wait(30) == 0, second.lines
                assert "leaving it to guard" in line
                return
            assert said in line
            assert first.stop() == 0
            second.wait_for("watching for exo")
        finally:
            assert second.stop() == 0


def test_a_sweep_configured_otherwise_waits_for_the_guardians_ending(
    exo_python: str, notes: Path, isolated_environment: Path, tmp_path: Path
) -> None:
    """A runner whose unwinding takes 3 s, SIGINTed by the guardian: a sweep from a
    shell with another registry, run meanwhile, reads the guardian's `begun` line in
    the user's record and waits, so the unwinding ends whole."""
    with guardian(isolated_environment) as running:
        worker = scenarios.start_worker(
            ["slowexit"],
            watch="none",
            python=exo_python,
            notes=notes,
            registry=isolated_environment,
        )
        try:
            running.watching(worker.pid)
            (runner,) = [runner.identity for runner in worker.runners]
            scenarios.kill_worker(worker)

            def events() -> list[object]:
                return [note["event"] for note in runner_notes.read_notes(notes, runner.pid)]

            assert wait_until(lambda: "unwinding" in events(), 10.0), running.lines
            swept = subprocess.run(
                [sys.executable, "-m", "exo_orphan_guard", "sweep"],
                env=_elsewhere(tmp_path),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert "the guardian has begun to end it" in swept.stderr + swept.stdout, swept
            assert scenarios.wait_gone([runner], 10.0)[runner] is not None
            assert "unwound" in events(), f"a second SIGINT cut it short: {events()}"
        finally:
            scenarios.cleanup(worker)
