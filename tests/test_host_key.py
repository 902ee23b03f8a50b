"""The registry's host directory: the hardware UUID on a Mac, today's key on Linux.

macOS renames itself at run time (DHCP and reverse-DNS names, Bonjour's "-2"); with
the hostname in the key, records written before a rename sat where no sweep looked.
The Mac's UUID is injected (gethostuuid(3) itself is in tests/test_darwin.py).
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import host_key
from exo_orphan_guard.records.registry import Registry
from tests.test_registry import sample

MAC_UUID = "6F9619FF-8B86-D011-B42D-00C04FC964FF"


@pytest.fixture
def a_mac(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This machine, answering gethostuuid(3) as a Mac does; hostname "studio"."""
    monkeypatch.setattr(system, "hardware_uuid", lambda: MAC_UUID)
    monkeypatch.setattr(socket, "gethostname", lambda: "studio")
    return monkeypatch


def loaded_pids(base: Path, *, create: bool) -> list[int]:
    registry, problem = Registry.open(base, create=create)
    assert registry is not None and problem is None
    records, warnings = registry.load()
    assert warnings == []
    return [loaded.record.pid for loaded in records]


def write_under_the_hostname_key(base: Path, hostname: str, *pids: int) -> Path:
    """What the previous release wrote on a Mac: records keyed by the hostname."""
    legacy = base / host_key.hostname_key(hostname)
    legacy.mkdir(parents=True, mode=0o700)
    for pid in pids:
        Registry(legacy).write(sample(pid))
    return legacy


def test_linux_keeps_todays_key_exactly() -> None:
    hostname = socket.gethostname()
    parts = [hostname]
    for path in ("/proc/self/ns/pid", "/etc/machine-id"):
        try:
            parts.append(
                os.readlink(path) if path.startswith("/proc") else Path(path).read_text().strip()
            )
        except OSError:
            parts.append("-")
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
    readable = hostname.split(".")[0] or "host"
    assert system.hardware_uuid() is None
    assert host_key.host_key() == host_key.HostKey(f"host-{readable}-{digest}", "hostname")


def test_a_macs_key_is_its_hardware_uuid_whatever_its_name() -> None:
    studio = host_key.key_for(MAC_UUID, "studio")
    renamed = host_key.key_for(MAC_UUID, "studio-2.local")
    assert studio.kind == renamed.kind == "hardware-uuid"
    assert studio.name == renamed.name and MAC_UUID not in studio.name  # hashed
    assert studio.legacy == host_key.hostname_key("studio")
    assert host_key.key_for("0" + MAC_UUID[1:], "studio").name != studio.name


def test_a_rename_keeps_the_records_found(a_mac: pytest.MonkeyPatch, tmp_path: Path) -> None:
    legacy = write_under_the_hostname_key(tmp_path, "studio", 4242, 4343)
    # Before any sweep or runner opened it to write, a scan reads the old directory.
    assert loaded_pids(tmp_path, create=False) == [4242, 4343]
    # The first sweep (or runner) moves them, once.
    assert loaded_pids(tmp_path, create=True) == [4242, 4343]
    assert not list(legacy.glob("runner-*"))
    # Then macOS renames the Mac: the records are still found, by sweeps and scans.
    a_mac.setattr(socket, "gethostname", lambda: "studio-2")
    assert loaded_pids(tmp_path, create=False) == [4242, 4343]
    assert loaded_pids(tmp_path, create=True) == [4242, 4343]


def test_a_newer_record_is_kept_over_the_old_one(a_mac: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_under_the_hostname_key(tmp_path, "studio", 4242)
    current, _ = Registry.open(tmp_path, create=True)
    assert current is not None
    newer = current.write(sample(4242))
    newer.write_bytes(newer.read_bytes().replace(b'"recorded_at": 1.0', b'"recorded_at": 2.0'))
    registry, _ = Registry.open(tmp_path, create=True)
    assert registry is not None
    (loaded,), _ = registry.load()
    assert loaded.record.recorded_at == 2.0


def test_journals_of_a_dead_sweep_move_too(a_mac: pytest.MonkeyPatch, tmp_path: Path) -> None:
    legacy = write_under_the_hostname_key(tmp_path, "studio")
    journal = legacy / "frozen-77-1.5.log"
    journal.write_text("78:2.5\n")
    journal.chmod(0o600)
    registry, _ = Registry.open(tmp_path, create=True)
    assert registry is not None
    assert (registry.path / journal.name).read_text() == "78:2.5\n" and not journal.exists()


def test_an_untrusted_old_directory_is_left_alone(
    a_mac: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    legacy = write_under_the_hostname_key(tmp_path, "studio", 4242)
    legacy.chmod(0o777)
    assert loaded_pids(tmp_path, create=True) == []
    assert (legacy / "runner-4242.json").exists()
