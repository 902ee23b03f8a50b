"""`decide` on made-up snapshots, by evidence: a spawn child is exo's runner when it
shows exo itself, when its live parent does, or when the guardian saw it under an exo
(`records.sightings`) that is now gone; a spawn child of a dead parent that nothing
names exo's is listed as orphaned, not known to be exo, and ended only by `--match`."""

from __future__ import annotations

import json
import re
import shlex

from exo_orphan_guard.sweeper import report_format
from exo_orphan_guard.sweeper.sweep_report import SweepReport
from exo_orphan_guard.sweeper.verdicts import NOT_KNOWN_EXO, SweepOptions, decide
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.snapshots import DEFAULT, EXO_PY, RUNNER_ARGV, by_pid, proc, table

EXO = ProcessIdentity(Pid(200), 200.0)
RUNNER = ProcessIdentity(Pid(300), 300.0)


def test_a_runner_seen_under_an_exo_that_is_gone_is_ended() -> None:
    # A runner of `python -m exo`: it shows nothing of exo's, from exo's environment.
    runner = proc(300, ppid=1, exo=False, environment=True)
    seen = {EXO: frozenset({runner.identity})}
    verdict = by_pid(decide(table(runner), [], DEFAULT, seen))[300]
    assert verdict.action == "kill" and verdict.rule == "fingerprint"
    assert "exo 200" in verdict.reason and "seen alive by the guardian" in verdict.reason


def test_a_runner_seen_under_a_live_exo_is_spared_whatever_its_parent() -> None:
    exo = proc(200, started=200.0, argv=(EXO_PY, "-m", "exo"))
    runner = proc(300, ppid=1, exo=False, environment=True)
    seen = {exo.identity: frozenset({runner.identity})}
    verdict = by_pid(decide(table(runner, exo), [], DEFAULT, seen))[300]
    assert verdict.action == "spare" and "exo 200, which is alive" in verdict.reason


def test_a_sighting_counts_for_that_very_process_only() -> None:
    # The pid of a seen runner, now another process's (another start).
    stranger = proc(300, ppid=1, exo=False, environment=True, started=999.0)
    seen = {EXO: frozenset({RUNNER})}
    verdict = by_pid(decide(table(stranger), [], DEFAULT, seen))[300]
    assert verdict.action == "spare" and verdict.not_known_exo


def test_an_orphan_from_exos_environment_that_shows_nothing_is_listed_not_ended() -> None:
    # A crashed script's ProcessPoolExecutor worker, run by exo's venv interpreter.
    worker = proc(300, ppid=1, exo=False, environment=True)
    verdict = by_pid(decide(table(worker), [], DEFAULT))[300]
    assert verdict.action == "spare" and verdict.rule is None and verdict.not_known_exo
    assert verdict.reason.startswith(NOT_KNOWN_EXO) and "--match" in verdict.reason
    # Only an explicit --match ends it.
    named = SweepOptions(match=re.compile("multiprocessing-fork"))
    verdict = by_pid(decide(table(worker), [], named))[300]
    assert verdict.action == "kill" and verdict.rule == "match"


def test_a_spawn_child_of_a_live_parent_showing_nothing_is_not_listed_as_orphaned() -> None:
    pool = proc(200, argv=(EXO_PY, "pool.py"), exo=False, environment=True)
    worker = proc(300, ppid=200, exo=False, environment=True)
    verdict = by_pid(decide(table(worker, pool), [], DEFAULT))[300]
    assert verdict.action == "spare" and not verdict.not_known_exo
    assert "may be its spawner" in verdict.reason


def test_a_runner_that_shows_exo_itself_needs_no_sighting() -> None:
    # The runner of exo's console script or frozen app maps exo's extension itself.
    verdict = by_pid(decide(table(proc(300, ppid=1)), [], DEFAULT))[300]
    assert verdict.action == "kill" and "maps exo's extension" in verdict.reason


def test_scan_lists_an_orphan_not_known_to_be_exo_without_being_asked() -> None:
    worker = proc(300, ppid=1, exo=False, environment=True)
    verdicts = decide(table(worker), [], DEFAULT)
    report = SweepReport(verdicts, (), (), True, None, 0.0)
    line = f"NOT KNOWN 300 ({shlex.join(RUNNER_ARGV)[:57]}...): {NOT_KNOWN_EXO}"
    assert line in report_format.to_table(report)
    document = json.loads(report_format.to_json(report, "scan"))
    assert document["suspects"] == [] and document["exit_code"] == 0
    assert [(entry["pid"], entry["not_known_exo"]) for entry in document["spared"]] == [(300, True)]
