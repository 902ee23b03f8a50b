"""exo's pidfile as the guardian reads it (`guardian.pidfile`): only a regular file,
never a blocking open, at most a few bytes, and on a thread a scan waits for only
briefly (a hung network path, by injection)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from exo_orphan_guard.guardian.pidfile import MAX_BYTES, PidfileReader, read_pidfile


def _read_within(path: Path, seconds: float) -> tuple[bool, int | None]:
    """Whether `read_pidfile` returned within `seconds`, and what (on a thread: a
    blocking open would otherwise hang the test)."""
    found: list[int | None] = []
    thread = threading.Thread(target=lambda: found.append(read_pidfile(path)), daemon=True)
    thread.start()
    thread.join(seconds)
    return (not thread.is_alive(), found[0] if found else None)


def test_a_fifo_at_the_pidfiles_path_is_not_opened(tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer: the scan that did stopped."""
    path = tmp_path / "exo.pid"
    os.mkfifo(path)
    assert _read_within(path, 2.0) == (True, None)


def test_neither_a_directory_nor_a_symlink_is_read(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "real").write_bytes(b"4242\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_pidfile(tmp_path / "dir") is None
    assert read_pidfile(tmp_path / "link") is None
    assert read_pidfile(tmp_path / "real") == 4242


def test_only_the_first_bytes_of_a_large_file_are_read(tmp_path: Path) -> None:
    path = tmp_path / "exo.pid"
    path.write_bytes(b"4242" + b" " * (MAX_BYTES - 4) + b"9" * 100_000)
    assert read_pidfile(path) == 4242
    path.write_bytes(b" " * MAX_BYTES + b"4242")
    assert read_pidfile(path) is None


def test_a_read_that_hangs_costs_a_scan_a_moment_and_one_thread(tmp_path: Path) -> None:
    """A pidfile on a network mount that stopped answering: the scan goes on without
    it after a moment; later scans do not wait at all, nor start another reader;
    once it answers, its pid is read again."""
    answer = threading.Event()
    reads: list[float] = []

    def hanging(path: Path) -> int | None:
        reads.append(time.monotonic())
        if len(reads) == 2:
            answer.wait(30)
        return 4242

    readers = _readers()
    reader = PidfileReader(tmp_path / "exo.pid", read=hanging, answer_seconds=0.2)
    assert reader.pid() == (4242, True)
    asked = time.monotonic()
    assert reader.pid() == (None, False)
    assert 0.2 <= time.monotonic() - asked < 2.0
    asked = time.monotonic()
    assert reader.pid() == (None, False)
    assert time.monotonic() - asked < 0.1, "a later scan waited for the hung read again"
    assert len(reads) == 2
    assert _readers() == readers + 1
    answer.set()
    deadline = time.monotonic() + 10
    while (found := reader.pid()) != (4242, True):
        assert time.monotonic() < deadline, found
        time.sleep(0.01)
    assert _readers() == readers + 1


def _readers() -> int:
    return [thread.name for thread in threading.enumerate()].count("pidfile")
