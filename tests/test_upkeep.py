"""What keeps the guardian's files bounded (`guardian.upkeep`), on real files and real
processes: hand-over markers no process can claim, `endings.jsonl` past its bound
(never while a sweep holds the registry's lock), the user's record of begun endings
(no line appended meanwhile lost)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from exo_orphan_guard import system
from exo_orphan_guard.guardian.upkeep import upkeep
from exo_orphan_guard.records import begun_record, endings, handover_marker
from exo_orphan_guard.records.endings import Ending
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.system.process_facts import Pid

BOOT = system.boot_id()


def _marker(base: Path, pid: int, at: float) -> Path:
    path = handover_marker.marker_path(base, pid)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "at": at}))
    path.chmod(0o600)
    return path


def _begun(pid: int, deadline: float, boot: str = BOOT) -> Ending:
    return Ending(
        event="begun",
        pid=Pid(pid),
        started=1.0,
        boot_id=boot,
        at=time.time(),
        by="sweep",
        why="a test's",
        deadline=deadline,
    )


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_markers_no_process_can_claim_are_removed_and_a_live_exos_kept(tmp_path: Path) -> None:
    base, home = tmp_path / "registry", tmp_path / "home"
    home.mkdir(mode=0o700)
    live = subprocess.Popen(["sleep", "60"])
    try:
        details = system.process_details(live.pid)
        assert details is not None
        kept = _marker(base, live.pid, details.create_time + 0.1)
        gone = _marker(base, _dead_pid(), time.time())
        reused = _marker(base, os.getpid(), 1.0)  # written long before this process began
        junk = base / "handover" / "12.json"
        junk.write_text("not a marker")
        fresh, stale = base / "handover" / ".a.tmp", base / "handover" / ".b.tmp"
        fresh.write_text("{")
        stale.write_text("{")
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
        upkeep(base, home, BOOT, time.time(), time.monotonic())
        assert sorted(path.name for path in (base / "handover").iterdir()) == sorted(
            [kept.name, fresh.name]
        )
        assert not gone.exists() and not reused.exists()
    finally:
        live.kill()
        live.wait()


def test_endings_past_their_bound_are_compacted_unless_a_sweep_holds_the_lock(
    tmp_path: Path,
) -> None:
    base, home = tmp_path / "registry", tmp_path / "home"
    home.mkdir(mode=0o700)
    registry, _ = Registry.open(base, create=True)
    assert registry is not None
    path = registry.path / endings.ENDINGS_NAME
    line = _begun(4242, 1.0).to_line()
    path.write_bytes(line * (endings.MAX_READ_BYTES // 2 // len(line) + 10))
    path.chmod(0o600)
    size = path.stat().st_size
    with registry.locked(1.0) as held:
        assert held
        upkeep(base, home, BOOT, time.time(), time.monotonic())
        assert path.stat().st_size == size, "compacted under a sweep's lock"
    upkeep(base, home, BOOT, time.time(), time.monotonic())
    assert path.stat().st_size == len(line) * endings.KEEP_LINES


def test_the_begun_record_keeps_what_is_current_and_loses_no_line_appended_meanwhile(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    now = time.monotonic()
    for pid in range(100, 400):
        begun_record.append(home, _begun(pid, now - 1.0))  # past: dropped
    begun_record.append(home, _begun(7, now + 60.0, boot="another boot"))
    appended: list[int] = []

    def append_current() -> None:
        for pid in range(1000, 1300):
            assert begun_record.append(home, _begun(pid, now + 600.0))
            appended.append(pid)

    writer = threading.Thread(target=append_current)
    writer.start()
    while writer.is_alive():
        begun_record.compact(home, BOOT, time.monotonic())
    writer.join()
    begun_record.compact(home, BOOT, time.monotonic())
    kept = [ending.pid for ending in begun_record.read(home, BOOT)]
    assert kept == appended == list(range(1000, 1300))
    assert len((home / begun_record.NAME).read_bytes().splitlines()) == 300
