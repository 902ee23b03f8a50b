"""exo's pidfile as the guardian reads it (`guardian.pidfile`): only a regular file,
never a blocking open, at most a few bytes, and on a thread no scan waits for (a hung
network path, by injection)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
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


def test_a_read_that_hangs_costs_no_scan_a_wait_and_one_thread(tmp_path: Path) -> None:
    """A pidfile on a network mount that stopped answering: no scan waits for it, the
    scans go on without it once a read is late, no second reader is started, and
    once it answers, its pid is read again."""
    answer = threading.Event()
    reads: list[float] = []

    def hanging(path: Path) -> int | None:
        reads.append(time.monotonic())
        if len(reads) == 2:
            answer.wait(30)
        return 4242

    readers = _readers()
    reader = PidfileReader(tmp_path / "exo.pid", read=hanging, answer_seconds=1.0)
    assert reader.pid() == (None, True), "nothing was read yet"
    _until(lambda: reader.pid() == (4242, True))  # and the second read, which hangs
    # At once, well within its second: the read just asked for is not late yet.
    assert reader.pid() == (4242, True), "a read under way is not late yet"
    _until(lambda: len(reads) == 2)
    time.sleep(1.0)
    for _ in range(3):
        asked = time.monotonic()
        assert reader.pid() == (None, False)
        assert time.monotonic() - asked < 0.1, "a scan waited for the hung read"
    assert len(reads) == 2
    assert _readers() == readers + 1
    answer.set()
    _until(lambda: reader.pid() == (4242, True))
    assert _readers() == readers + 1


def test_each_scan_takes_what_a_read_before_it_found(tmp_path: Path) -> None:
    """A scan is given the last answer, and asks for the next: the pidfile written,
    a later scan names its pid; removed, a later scan names none."""
    path = tmp_path / "exo.pid"
    reader = PidfileReader(path)
    assert reader.pid() == (None, True)
    path.write_text("4242\n")
    _until(lambda: reader.pid() == (4242, True))
    path.unlink()
    _until(lambda: reader.pid() == (None, True))


def _until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.01)


def _readers() -> int:
    return [thread.name for thread in threading.enumerate()].count("pidfile")
