from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from exo_orphan_guard.records import trust
from exo_orphan_guard.records.registry import (
    MAX_RECORD_BYTES,
    Registry,
    RunnerRecord,
    parse_record,
    record_file_problem,
)
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def sample(pid: int = 4242) -> RunnerRecord:
    return RunnerRecord(
        pid=Pid(pid),
        started=12.5,
        boot_id="boot",
        uid=os.geteuid(),
        worker=ProcessIdentity(Pid(99), 3.25),
        exe="/usr/bin/python3",
        argv=("python", "-c", "x", "--multiprocessing-fork"),
        pgid=pid,
        recorded_at=1.0,
        labels={"runner_id": "r", "instance_id": "i"},
    )


def open_registry(path: Path) -> Registry:
    registry, problem = Registry.open(path, create=True)
    assert registry is not None and problem is None
    return registry


def test_record_round_trips_through_json() -> None:
    assert parse_record(sample().to_json()) == sample()


@pytest.mark.parametrize(
    ("mutation", "complaint"),
    [
        ({"schema": "other/1"}, "schema"),
        ({"pid": 0}, "pid"),
        ({"pid": True}, "pid"),
        ({"pid": "12"}, "pid"),
        ({"started": "soon"}, "started"),
        ({"started": float("nan")}, "started"),
        ({"worker": [1, 2]}, "worker"),
        ({"worker": {"pid": 1}}, "started"),
        ({"argv": "python"}, "argv"),
        ({"argv": ["python", 3]}, "argv"),
        ({"labels": {"a": 1}}, "labels"),
        ({"boot_id": ""}, "boot_id"),
        ({"exe": 5}, "exe"),
        ({"pgid": 1.5}, "pgid"),
    ],
)
def test_parse_rejects_each_malformed_field(mutation: dict[str, object], complaint: str) -> None:
    document = json.loads(sample().to_json())
    document.update(mutation)
    with pytest.raises(ValueError, match=complaint):
        parse_record(json.dumps(document).encode())


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe\x00garbage", b"[]", b"null", b'"x"'])
def test_parse_rejects_garbage(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_record(data)


def test_truncated_record_is_rejected() -> None:
    data = sample().to_json()
    for cut in (1, len(data) // 2, len(data) - 1):
        with pytest.raises(ValueError):
            parse_record(data[:cut])


def fake_stat(mode: int, uid: int, size: int = 10) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, 0, size, 0, 0, 0))


def test_directory_and_file_checks() -> None:
    me = os.geteuid()

    def directory_problem(info: os.stat_result, uid: int) -> str | None:
        return trust.problem(info, uid, "directory")

    assert directory_problem(fake_stat(stat.S_IFDIR | 0o700, me), me) is None
    assert "symlink" in str(directory_problem(fake_stat(stat.S_IFLNK | 0o777, me), me))
    assert "writable" in str(directory_problem(fake_stat(stat.S_IFDIR | 0o777, me), me))
    assert "owned" in str(directory_problem(fake_stat(stat.S_IFDIR | 0o700, me + 1), me))
    assert "not a directory" in str(directory_problem(fake_stat(stat.S_IFREG | 0o600, me), me))
    assert record_file_problem(fake_stat(stat.S_IFREG | 0o644, me), me) is None
    assert "writable" in str(record_file_problem(fake_stat(stat.S_IFREG | 0o620, me), me))
    assert "regular" in str(record_file_problem(fake_stat(stat.S_IFIFO | 0o600, me), me))
    big = fake_stat(stat.S_IFREG | 0o600, me, MAX_RECORD_BYTES + 1)
    assert "bytes" in str(record_file_problem(big, me))


def test_directory_is_created_private(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "a" / "registry")
    assert stat.S_IMODE(os.lstat(registry.path).st_mode) == 0o700
    path = registry.write(sample())
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    records, warnings = registry.load()
    assert [loaded.record for loaded in records] == [sample()] and warnings == []


@pytest.mark.parametrize("how", ["world-writable", "symlink", "foreign"])
def test_untrustworthy_directory_is_refused(tmp_path: Path, how: str) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    path = real
    if how == "world-writable":
        real.chmod(0o777)
    elif how == "symlink":
        path = tmp_path / "link"
        path.symlink_to(real)
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(real, NOBODY, NOBODY)
    registry, problem = Registry.open(path, create=True)
    assert registry is None and problem is not None and "refusing" in problem
    assert "\n" not in problem


def test_bad_files_each_get_a_warning_and_good_ones_still_load(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry")
    registry.write(sample(1))
    (registry.path / "runner-2.json").write_bytes(b"{not json")
    (registry.path / "runner-3.json").write_bytes(sample(3).to_json()[:40])
    (registry.path / "runner-4.json").write_bytes(os.urandom(64))
    writable = registry.path / "runner-5.json"
    writable.write_bytes(sample(5).to_json())
    writable.chmod(0o666)
    target = tmp_path / "elsewhere.json"
    target.write_bytes(sample(6).to_json())
    (registry.path / "runner-6.json").symlink_to(target)
    (registry.path / "notes.txt").write_text("ignored: not a record name")
    if os.geteuid() == 0:
        foreign = registry.path / "runner-7.json"
        foreign.write_bytes(sample(7).to_json())
        os.chown(foreign, NOBODY, NOBODY)
    records, warnings = registry.load()
    assert [loaded.record.pid for loaded in records] == [1]
    expected_bad = 6 if os.geteuid() == 0 else 5
    assert len(warnings) == expected_bad, warnings
    assert all("\n" not in warning and "runner-" in warning for warning in warnings)


def _write_forever(path: str, stop_at: float) -> None:
    registry, _ = Registry.open(Path(path), create=False)
    assert registry is not None
    record = sample(77)
    while time.monotonic() < stop_at:
        registry.write(record)


def test_writes_are_atomic_for_concurrent_readers(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry")
    registry.write(sample(77))
    writer = multiprocessing.get_context("spawn").Process(
        target=_write_forever, args=(str(registry.path), time.monotonic() + 2.0)
    )
    writer.start()
    reads = 0
    try:
        while writer.is_alive():
            records, warnings = registry.load()
            assert warnings == [] and [loaded.record for loaded in records] == [sample(77)]
            reads += 1
    finally:
        writer.join()
    assert reads > 50


def test_stale_temporaries_are_removed(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry")
    old = registry.path / ".tmp-1-1"
    fresh = registry.path / ".tmp-2-2"
    old.write_bytes(b"{")
    fresh.write_bytes(b"{")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    registry.remove_stale_temporaries(time.time())
    assert not old.exists() and fresh.exists()


def test_lock_serialises_and_times_out(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry")
    order: list[str] = []
    with registry.locked(1.0) as first:
        assert first

        def second() -> None:
            with registry.locked(5.0) as acquired:
                order.append(f"second:{acquired}")

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.3)
        order.append("first done")
        with registry.locked(0.1) as third:
            assert not third
    thread.join()
    assert order == ["first done", "second:True"]


@needs_root
def test_foreign_owned_record_is_refused(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry")
    path = registry.write(sample(8))
    os.chown(path, NOBODY, NOBODY)
    records, warnings = registry.load()
    assert records == [] and "owned by uid 65534" in warnings[0]
