"""Which exo processes the guardian watches (pure, on made-up snapshots), and the
settings and files it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exo_orphan_guard.guardian.leaving import STARTING_SECONDS, starting
from exo_orphan_guard.guardian.pidfile import read_pidfile
from exo_orphan_guard.guardian.watchlist import Remembering, exo_processes, newly_watched, remember
from exo_orphan_guard.records import handover_marker, sightings
from exo_orphan_guard.sweeper.process_table import ProcessInfo
from exo_orphan_guard.sweeper.verdicts import SweepOptions, decide
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.snapshots import EXO_PY, FROZEN_ARGV, UID, proc, table

WORKER_ARGV = (EXO_PY, "-m", "exo")
TRACKER_ARGV = (EXO_PY, "-c", "from multiprocessing.resource_tracker import main;main(5)")


def _watch(*processes: ProcessInfo, protected: tuple[int, ...] = ()) -> dict[int, set[int]]:
    snapshot = table(*processes, protected=protected)
    verdicts = decide(snapshot, [], SweepOptions(fingerprint=True))
    found = exo_processes(snapshot, verdicts)
    return {process.pid: {runner.pid for runner in runners} for process, runners in found.items()}


def test_a_live_exo_with_runners_is_watched_with_them_and_its_other_children_are_not() -> None:
    # exo shows itself (its extension mapped); the runners of `python -m exo` show
    # nothing of exo's, and are watched as its spawn children.
    worker = proc(200, 1, argv=WORKER_ARGV)
    tracker = proc(201, 200, argv=TRACKER_ARGV, exo=False)
    macmon = proc(202, 200, argv=("macmon", "pipe", "--interval", "1000"), exo=False)
    runners = proc(210, 200, exo=False), proc(211, 200, exo=False)
    assert _watch(worker, tracker, macmon, *runners) == {200: {210, 211}}


def test_the_frozen_app_is_watched_like_a_python_exo() -> None:
    app = proc(300, 1, argv=(FROZEN_ARGV[0],))
    assert _watch(app, proc(310, 300, argv=FROZEN_ARGV)) == {300: {310}}


def test_nothing_is_watched_that_is_not_an_exo_parent_of_this_user() -> None:
    assert _watch(proc(400, 1, exo=False), proc(410, 400, exo=False)) == {}, "not exo's"
    other = proc(500, 1, argv=WORKER_ARGV, uid=UID + 1)
    assert _watch(other, proc(510, 500, uid=UID + 1)) == {}, "another user's"
    assert _watch(proc(600, 1, argv=WORKER_ARGV), proc(610, 600), protected=(600,)) == {}


def test_a_program_from_exos_environment_that_shows_nothing_of_exo_is_not_watched() -> None:
    # A script with a ProcessPoolExecutor, run by exo's venv interpreter.
    pool = proc(900, 1, argv=(EXO_PY, "pool.py"), exo=False, environment=True)
    assert _watch(pool, proc(910, 900, exo=False), proc(911, 900, exo=False)) == {}
    # Nor a live parent showing nothing whose child shows exo (a subreaper, say).
    assert _watch(proc(920, 1, argv=("tmux",), exo=False), proc(930, 920)) == {}


def test_an_orphan_is_ended_not_watched_and_pid_1_is_never_watched() -> None:
    # A runner reparented to init: its spawner is gone, a verdict ends it.
    assert _watch(proc(700, 1)) == {}


def test_a_pidfile_names_an_exo_before_it_has_runners() -> None:
    worker = proc(800, 1, argv=WORKER_ARGV)
    snapshot = table(worker)
    found = exo_processes(snapshot, (), [worker])
    assert list(found) == [worker.identity] and found[worker.identity] == frozenset()
    assert newly_watched({}, found) == [worker.identity]
    assert newly_watched(found, found) == []


def test_what_is_watched_is_remembered_for_when_its_exo_is_gone(tmp_path: Path) -> None:
    never = 2**22 + 10  # above any pid_max: never a live process here
    worker = proc(never, 1, argv=WORKER_ARGV)
    snapshot = table(worker, proc(never + 1, never, exo=False))
    found = exo_processes(snapshot, ())
    assert found == {worker.identity: frozenset({snapshot.processes[Pid(never + 1)].identity})}
    assert remember(tmp_path, snapshot, found) is None
    assert sightings.read(tmp_path, snapshot.boot_id) == found
    # The next scan: the exo and its runner are gone (no live process has their
    # identities): nothing is kept.
    assert remember(tmp_path, snapshot, {}) is None
    assert sightings.read(tmp_path, snapshot.boot_id) == {}


def test_the_sightings_are_written_again_when_what_is_watched_or_the_file_changed(
    tmp_path: Path,
) -> None:
    """A scan that watches what the last one did leaves the file alone, unless it was
    removed or replaced meanwhile: then what is watched is written again."""
    never = 2**22 + 10
    worker = proc(never, 1, argv=WORKER_ARGV)
    snapshot = table(worker, proc(never + 1, never, exo=False))
    found = exo_processes(snapshot, ())
    remembering = Remembering()
    path = tmp_path / sightings.SIGHTINGS_NAME
    assert remembering.remember(tmp_path, snapshot, found) is None
    written = path.stat().st_ino
    assert remembering.remember(tmp_path, snapshot, found) is None
    assert path.stat().st_ino == written
    path.unlink()
    assert remembering.remember(tmp_path, snapshot, found) is None
    assert sightings.read(tmp_path, snapshot.boot_id) == found
    assert remembering.remember(tmp_path, snapshot, {}) is None
    assert sightings.read(tmp_path, snapshot.boot_id) == {}, "its runner is not alive"


def test_exos_pidfile_is_where_exo_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path.home()
    assert settings.exo_pidfile({"EXO_HOME": "exo-b"}) == home / "exo-b" / "exo.pid"
    assert settings.exo_pidfile({}, "darwin") == home / ".exo" / "exo.pid"
    assert settings.exo_pidfile({}, "linux") == home / ".cache" / "exo" / "exo.pid"
    assert settings.exo_pidfile({"XDG_CACHE_HOME": "/c"}, "linux") == Path("/c/exo/exo.pid")


@pytest.mark.parametrize(
    ("content", "pid"), [(b"4242\n", 4242), (b"", None), (b"not a pid", None), (b"1", None)]
)
def test_a_pidfile_is_read_without_trusting_it(tmp_path: Path, content: bytes, pid: int) -> None:
    path = tmp_path / "exo.pid"
    path.write_bytes(content)
    assert read_pidfile(path) == pid
    assert read_pidfile(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("raw", "seconds", "warned"),
    [(None, 2.0, False), ("0.5", 0.5, False), ("0", 2.0, True), ("soon", 2.0, True)],
)
def test_the_scan_interval_setting(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, seconds: float, warned: bool
) -> None:
    if raw is None:
        monkeypatch.delenv(settings.SCAN_INTERVAL_ENV, raising=False)
    else:
        monkeypatch.setenv(settings.SCAN_INTERVAL_ENV, raw)
    parsed = settings.scan_interval_setting()
    assert (parsed.value, parsed.warning is not None) == (seconds, warned)


def test_a_hand_over_marker_counts_only_for_the_process_that_wrote_it(tmp_path: Path) -> None:
    path = handover_marker.marker_path(tmp_path, 4242)
    path.parent.mkdir(mode=0o700)
    path.write_text(json.dumps({"pid": 4242, "at": 1000.0}))
    path.chmod(0o600)
    assert handover_marker.hands_over(tmp_path, 4242, wall_start=999.0)
    # Written before the process now holding pid 4242 started: another process's.
    assert not handover_marker.hands_over(tmp_path, 4242, wall_start=1100.0)
    assert not handover_marker.hands_over(tmp_path, 4243, wall_start=999.0), "no marker"
    path.chmod(0o666)
    assert handover_marker.written_at(tmp_path, 4242) is None, "writable by others"
    path.chmod(0o600)
    for corrupt in ("{", "[]", json.dumps({"pid": 1, "at": 1000.0}), json.dumps({"pid": 4242})):
        path.write_text(corrupt)
        assert handover_marker.written_at(tmp_path, 4242) is None, corrupt
    handover_marker.remove(tmp_path, 4242)
    handover_marker.remove(tmp_path, 4242)
    assert not path.exists()


def test_a_young_orphan_not_known_to_be_exo_keeps_a_guardian_from_leaving() -> None:
    """A runner whose exo died before a scan saw it under its live parent shows it is
    exo's only once its start-up maps exo's extension: a guardian about to leave
    waits for that, not for an old one (a notebook's pool child, say)."""
    orphan = proc(700, 1, exo=False, environment=True)  # create_time 1700.0
    verdicts = decide(table(orphan), [], SweepOptions(fingerprint=True))
    (verdict,) = [verdict for verdict in verdicts if verdict.pid == 700]
    assert verdict.not_known_exo and verdict.action == "spare"
    assert starting(verdicts, now=1700.0 + STARTING_SECONDS - 1)
    assert not starting(verdicts, now=1700.0 + STARTING_SECONDS)
    exo_orphan = decide(table(proc(710, 1)), [], SweepOptions(fingerprint=True))
    assert not starting(exo_orphan, now=1710.0), "one known to be exo is ended, not waited on"
