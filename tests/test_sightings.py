"""What the guardian saw (`records.sightings`): kept on disk, bounded, trusted only as
the registry is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exo_orphan_guard.records import sightings
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.snapshots import BOOT

EXO = ProcessIdentity(Pid(200), 200.0)
RUNNER = ProcessIdentity(Pid(300), 300.0)
OTHER = ProcessIdentity(Pid(301), 301.0)


def _alive(runner: ProcessIdentity) -> bool:
    return True


def test_what_was_seen_is_read_back_for_this_boot_only(tmp_path: Path) -> None:
    sightings.write(tmp_path, BOOT, {EXO: frozenset({RUNNER, OTHER})})
    assert sightings.read(tmp_path, BOOT) == {EXO: frozenset({RUNNER, OTHER})}
    assert sightings.read(tmp_path, "boot-b") == {}, "another boot's pids mean nothing"
    assert sightings.read(tmp_path / "missing", BOOT) == {}
    mode = os.stat(tmp_path / sightings.SIGHTINGS_NAME).st_mode & 0o777
    assert mode == 0o600


def test_a_sighting_outlives_its_exo_while_a_runner_lives(tmp_path: Path) -> None:
    assert sightings.remember(tmp_path, BOOT, {EXO: frozenset({RUNNER, OTHER})}, _alive) is None
    # The next scan: the exo is gone (not seen), one of its runners lives on.
    assert sightings.remember(tmp_path, BOOT, {}, lambda runner: runner == RUNNER) is None
    assert sightings.read(tmp_path, BOOT) == {EXO: frozenset({RUNNER})}
    # Its last runner gone: the sighting goes too.
    assert sightings.remember(tmp_path, BOOT, {}, lambda runner: False) is None
    assert sightings.read(tmp_path, BOOT) == {}


def test_an_unchanged_sighting_is_not_written_again(tmp_path: Path) -> None:
    seen = {EXO: frozenset({RUNNER})}
    sightings.remember(tmp_path, BOOT, seen, _alive)
    path = tmp_path / sightings.SIGHTINGS_NAME
    before = path.stat().st_ino
    sightings.remember(tmp_path, BOOT, seen, _alive)
    assert path.stat().st_ino == before


def test_sightings_stay_bounded() -> None:
    many = {
        ProcessIdentity(Pid(1000 + index), float(index)): frozenset(
            ProcessIdentity(Pid(10_000 + index * 100 + runner), float(runner))
            for runner in range(sightings.MAX_RUNNERS + 5)
        )
        for index in range(sightings.MAX_EXO + 5)
    }
    kept = sightings.merged({}, many, _alive)
    assert list(kept) == list(many)[-sightings.MAX_EXO :], "the newest exo processes"
    for exo, runners in kept.items():
        newest = sorted(many[exo], key=lambda runner: runner.started)[-sightings.MAX_RUNNERS :]
        assert runners == frozenset(newest), "the newest runners of each"


@pytest.mark.parametrize(
    "spoil",
    ["mode", "symlink", "corrupt", "schema", "bad pid", "huge"],
)
def test_a_sightings_file_that_cannot_be_trusted_says_nothing(tmp_path: Path, spoil: str) -> None:
    sightings.write(tmp_path, BOOT, {EXO: frozenset({RUNNER})})
    path = tmp_path / sightings.SIGHTINGS_NAME
    document = json.loads(path.read_text())
    if spoil == "mode":
        path.chmod(0o666)
    elif spoil == "symlink":
        real = tmp_path / "elsewhere.json"
        path.rename(real)
        path.symlink_to(real)
    elif spoil == "corrupt":
        path.write_text("{")
    elif spoil == "schema":
        path.write_text(json.dumps({**document, "schema": "something/else"}))
    elif spoil == "bad pid":
        document["exo"][0]["runners"] = [[True, 300.0]]
        path.write_text(json.dumps(document))
    else:
        path.write_text(" " * (sightings.MAX_BYTES + 1) + json.dumps(document))
    assert sightings.read(tmp_path, BOOT) == {}


def test_a_sighting_that_cannot_be_written_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "registry").mkdir(mode=0o500)
    warning = sightings.remember(tmp_path / "registry", BOOT, {EXO: frozenset({RUNNER})}, _alive)
    if os.geteuid() == 0:  # root writes through a read-only mode
        assert warning is None
    else:
        assert warning is not None and sightings.SIGHTINGS_NAME in warning


@pytest.mark.parametrize("change", ["replaced", "removed", "mode", "another boot"])
def test_the_guardians_reader_reads_again_whatever_changed_the_file(
    tmp_path: Path, change: str
) -> None:
    """The guardian asks at every scan (`Reader`): an unchanged file is not parsed
    again, but a new one, none, or one that can no longer be trusted is seen at once."""
    reader = sightings.Reader()
    sightings.write(tmp_path, BOOT, {EXO: frozenset({RUNNER})})
    assert reader.read(tmp_path, BOOT) == {EXO: frozenset({RUNNER})}
    path = tmp_path / sightings.SIGHTINGS_NAME
    expected: dict[ProcessIdentity, frozenset[ProcessIdentity]] = {}
    boot = BOOT
    if change == "replaced":
        sightings.write(tmp_path, BOOT, {EXO: frozenset({OTHER})})
        expected = {EXO: frozenset({OTHER})}
    elif change == "removed":
        path.unlink()
    elif change == "mode":
        path.chmod(0o666)
    else:
        boot = "boot-b"
    assert reader.read(tmp_path, boot) == expected
