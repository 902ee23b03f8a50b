"""A FIFO at exo's pidfile path (what a blocking open waits on forever) does not stop
a real guardian's scans: it still watches a new exo and ends its runners."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import settings
from tests.helpers.guardian import guardian

pytestmark = [
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc"),
]


def test_a_fifo_at_exos_pidfile_path_stops_no_scan(
    exo_python: str, notes: Path, isolated_environment: Path, tmp_path: Path
) -> None:
    """Before, the first scan's open() waited for a writer: no exo was ever watched,
    and a killed one's runners lived on."""
    cache = tmp_path / "cache"
    environ = {"XDG_CACHE_HOME": str(cache)}
    pidfile = settings.exo_pidfile({**os.environ, **environ}, "linux")
    pidfile.parent.mkdir(parents=True)
    os.mkfifo(pidfile)
    with guardian(isolated_environment, **environ) as running:
        worker = scenarios.start_worker(
            ["idle"], watch="none", python=exo_python, notes=notes, registry=isolated_environment
        )
        try:
            running.watching(worker.pid, timeout=15.0)
            runners = [runner.identity for runner in worker.runners]
            scenarios.kill_worker(worker)
            exits = scenarios.wait_gone(runners, 10.0)
            assert all(at is not None for at in exits.values()), running.lines
        finally:
            scenarios.cleanup(worker)
