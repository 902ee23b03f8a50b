"""A real guardian keeps its files bounded itself, with no sweep: the hand-over marker
of an exo that died unwatched, an `endings.jsonl` past its bound, and begun lines
whose deadline is past are gone within a few scans."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import begun_record, endings, handover_marker
from exo_orphan_guard.records.endings import Ending
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.guardian import guardian, guardian_home
from tests.helpers.waiting import wait_until

pytestmark = [
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc"),
]


def test_the_guardian_bounds_markers_endings_and_begun_lines_itself(
    isolated_environment: Path,
) -> None:
    """Before, a marker went only at a watched death, `endings.jsonl` was compacted
    only by a sweep, and nothing removed a begun line."""
    registry, _ = Registry.open(isolated_environment, create=True)
    assert registry is not None
    home = guardian_home()
    boot = system.boot_id()
    line = Ending(
        event="begun",
        pid=Pid(4242),
        started=1.0,
        boot_id=boot,
        at=time.time(),
        by="sweep",
        why="a test's",
        deadline=time.monotonic() - 1.0,
    )
    path = registry.path / endings.ENDINGS_NAME
    path.write_bytes(line.to_line() * (endings.MAX_READ_BYTES // len(line.to_line())))
    path.chmod(0o600)
    assert begun_record.append(home, line)
    with guardian(isolated_environment, EXO_ORPHAN_GUARD_SCAN_INTERVAL="0.1") as running:
        dead = subprocess.Popen(["true"])
        dead.wait()
        marker = handover_marker.marker_path(isolated_environment, dead.pid)
        marker.parent.mkdir(mode=0o700, exist_ok=True)
        marker.write_text(json.dumps({"pid": dead.pid, "at": time.time()}))
        marker.chmod(0o600)
        bound = endings.KEEP_LINES * len(line.to_line())
        assert wait_until(
            lambda: (
                not marker.exists()
                and path.stat().st_size <= bound
                and (home / begun_record.NAME).read_bytes() == b""
            ),
            15.0,
        ), running.lines
