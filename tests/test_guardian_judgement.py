"""When a guardian's scan keeps the last judgement (`guardian.judgement`: pure, on
made-up scans)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from exo_orphan_guard.guardian.judgement import Judgement, Place, place_of, still_stands
from exo_orphan_guard.guardian.watchlist import exo_processes
from exo_orphan_guard.sweeper.process_table import ProcessInfo
from exo_orphan_guard.sweeper.verdicts import SweepOptions, Verdict, decide
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.snapshots import EXO_PY, proc, record, table

WORKER = proc(200, 1, argv=(EXO_PY, "-m", "exo"))
RUNNERS = (proc(210, 200, exo=False), proc(211, 200, exo=False))
CANDIDATES = frozenset({Pid(210), Pid(211)})
SETTLED_NS = time.time_ns()
PLACE = Place(((1, 2, 3), None), SETTLED_NS)


def _judged(*processes: ProcessInfo) -> Judgement:
    snapshot = table(WORKER, *RUNNERS, *processes)
    verdicts = decide(snapshot, [], SweepOptions(fingerprint=True))
    found = exo_processes(snapshot, verdicts)
    candidates = frozenset(info.pid for info in snapshot.processes.values() if info.is_spawn_child)
    return Judgement(snapshot, verdicts, (), found, candidates, (), False, (), PLACE)


def _stands(
    last: Judgement,
    *,
    candidates: frozenset[Pid] | None = None,
    unchanged: bool = True,
    named_pids: tuple[int, ...] = (),
    watched: set[ProcessIdentity] | None = None,
    exit_watched: set[ProcessIdentity] | None = None,
    place: Place = PLACE,
) -> bool:
    """`last` against a scan that found what it did, but for what is given."""
    return still_stands(
        last,
        last.candidates if candidates is None else candidates,
        unchanged,
        named_pids,
        set(last.found) if watched is None else watched,
        set(last.found) if exit_watched is None else exit_watched,
        place,
    )


def test_an_idle_exo_watched_keeps_its_judgement() -> None:
    last = _judged()
    assert last.candidates == CANDIDATES and _stands(last)


def test_anything_new_or_named_judges_again() -> None:
    last = _judged()
    assert not _stands(last, unchanged=False), "a candidate's pid handed out again"
    assert not _stands(last, candidates=CANDIDATES | {Pid(212)}), "a new runner"
    assert not _stands(last, candidates=frozenset({Pid(210)})), "a runner gone from the reads"
    assert not _stands(last, named_pids=(300,)), "exo's pidfile names a process"


def test_a_death_or_an_exit_watch_not_in_place_judges_again() -> None:
    last = _judged()
    assert not _stands(last, watched=set()), "the exo died: its exit watch said so"
    assert not _stands(last, exit_watched=set()), "no exit watch would say so"


def test_a_candidate_that_is_not_a_watched_exos_runner_judges_again() -> None:
    """Its parent's death shows only in a scan: no exit watch is on that parent."""
    pool = proc(400, 1, argv=(EXO_PY, "pool.py"), exo=False, environment=True)
    last = _judged(pool, proc(410, 400, exo=False))
    assert Pid(410) in last.candidates and not _stands(last)


def test_an_orphan_to_end_or_a_young_one_judges_again() -> None:
    last = _judged(proc(510, 1))  # exo's runner, its spawner gone
    assert any(verdict.action == "kill" for verdict in last.verdicts)
    assert not _stands(last)
    assert not _stands(dataclasses.replace(_judged(), starting=True))
    # An ending decided for a process that is no candidate: a recorded runner, say.
    ending = Verdict(Pid(600), "kill", "its worker is gone")
    assert not _stands(dataclasses.replace(_judged(), verdicts=(ending,)))


def test_a_runner_record_or_a_registry_changed_judges_again() -> None:
    """A recorded runner may be any process, and its worker's death shows only in a
    judgement; a record written since shows in the registry's directories."""
    idle = _judged()
    recorded = Verdict(
        Pid(600), "spare", "its worker is alive", record=record(600, WORKER.identity)
    )
    assert not _stands(dataclasses.replace(idle, verdicts=(*idle.verdicts, recorded)))
    assert not _stands(idle, place=Place(((1, 2, 4), None), SETTLED_NS)), "a record written"
    made = Place(((1, 2, 3), (1, 5, 6)), SETTLED_NS)
    assert not _stands(idle, place=made), "the host's directory made"


def test_a_record_written_changes_the_registrys_place(tmp_path: Path) -> None:
    before = place_of([tmp_path, tmp_path / "host"])
    assert before.directories[0] is not None and before.directories[1] is None
    (tmp_path / "host").mkdir()
    made = place_of([tmp_path, tmp_path / "host"])
    assert made != before
    time.sleep(0.01)  # a coarse clock could give the rename the mkdir's time
    (tmp_path / "host" / ".tmp").write_text("{}")
    (tmp_path / "host" / ".tmp").rename(tmp_path / "host" / "runner-600.json")
    assert place_of([tmp_path, tmp_path / "host"]) != made


def test_a_record_written_within_the_mtimes_granule_after_the_look_judges_again(
    tmp_path: Path,
) -> None:
    """A directory's mtime is the kernel's coarse clock (a tick, 1-10 ms on Linux; a
    whole second or two on some filesystems): a record written after the judgement
    looked, within that granule, leaves the directory as the look saw it. Here the
    write keeps the directory's time on purpose (`os.utime`), as such a write would."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "runner-600.json").write_text("{}")
    judged = dataclasses.replace(_judged(), registry=(host,), place=place_of([host]))
    looked = host.stat()
    (host / "runner-601.json").write_text("{}")
    os.utime(host, ns=(looked.st_atime_ns, looked.st_mtime_ns))
    assert place_of([host]) == judged.place, "the write does not show"
    assert not _stands(judged, place=place_of([host]))


def test_a_judgement_whose_registry_was_long_unchanged_stands(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "runner-600.json").write_text("{}")
    older = time.time_ns() - 60 * 10**9
    os.utime(host, ns=(older, older))
    judged = dataclasses.replace(_judged(), registry=(host,), place=place_of([host]))
    assert _stands(judged, place=place_of([host]))
    (host / "runner-601.json").write_text("{}")
    assert not _stands(judged, place=place_of([host])), "a record written"
