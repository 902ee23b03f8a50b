"""How `endings.jsonl` is read and compacted (`records.endings`): a line at a time,
and for a sweeper's targets only, so that a guardian's memory does not grow with the
file (what `make soak` found)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_orphan_guard.records import endings
from exo_orphan_guard.records.endings import Ending
from exo_orphan_guard.system.process_facts import Pid

BOOT = "this boot"


def _line(pid: int, boot: str = BOOT, event: endings.Event = "ended") -> Ending:
    return Ending(
        event=event,
        pid=Pid(pid),
        started=1.0,
        boot_id=boot,
        at=1796600000.125,
        by="guardian",
        how="clean" if event == "ended" else None,
        why="a test's",
    )


def _write(path: Path, lines: list[Ending]) -> None:
    path.write_bytes(b"".join(line.to_line() for line in lines))
    path.chmod(0o600)


def test_only_the_lines_of_the_pids_asked_for_are_parsed_and_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / endings.ENDINGS_NAME
    lines = [_line(pid) for pid in range(1000, 1400)]
    lines += [_line(1007, event="begun"), _line(1007, boot="an earlier boot"), _line(10070)]
    _write(path, lines)
    parsed: list[bytes] = []
    real = endings.parse_line

    def counting(line: bytes) -> Ending | None:
        parsed.append(line)
        return real(line)

    monkeypatch.setattr(endings, "parse_line", counting)
    found = endings.read(path, BOOT, {1007, 1399})
    assert [(e.pid, e.event) for e in found] == [(1007, "ended"), (1399, "ended"), (1007, "begun")]
    assert len(parsed) == 4, "a line naming none of the pids was parsed"
    assert len(endings.read(path, BOOT)) == 402


def test_a_file_past_the_read_bound_is_read_from_a_whole_line(tmp_path: Path) -> None:
    path = tmp_path / endings.ENDINGS_NAME
    line = _line(4242).to_line()
    _write(path, [_line(4242)] * (endings.MAX_READ_BYTES // len(line) + 50))
    assert len(endings.read(path, BOOT, {4242})) == endings.MAX_READ_BYTES // len(line)
    # Ending exactly on a line's start: that line is whole, and read.
    _write(path, [_line(4242)] * 3)
    exact = [_line(4343 + n) for n in range(endings.MAX_READ_BYTES // len(line) + 2)]
    assert all(len(e.to_line()) == len(line) for e in exact)
    pad = endings.MAX_READ_BYTES % len(line)
    path.write_bytes(b"x" * (len(line) - pad - 1) + b"\n" + b"".join(e.to_line() for e in exact))
    assert len(endings.read(path, BOOT)) == endings.MAX_READ_BYTES // len(line)


def test_compaction_keeps_this_boots_newest_lines_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / endings.ENDINGS_NAME
    lines = [_line(pid) for pid in range(1, 3000)] + [_line(5, boot="an earlier boot")]
    _write(path, lines)
    assert path.stat().st_size > endings.MAX_READ_BYTES // 2
    endings.compact(path, BOOT)
    kept = path.read_bytes().splitlines(keepends=True)
    assert kept == [line.to_line() for line in lines[-1 - endings.KEEP_LINES : -1]]
