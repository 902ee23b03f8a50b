"""Sweeps and clean endings, on real processes: a sweep waits for a guarded runner that
is ending the clean way instead of killing it early, a SIGTERM does not cut a clean
ending short, and every result says how its target ended."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import settings
from exo_orphan_guard.tools import cli
from tests.conftest import StartWorker
from tests.helpers.waiting import wait_for_note

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

GRACE = 3.0


@pytest.fixture(autouse=True)
def graced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.GRACE_ENV, str(GRACE))


def test_a_sweep_waits_for_a_shutdown_under_way_instead_of_killing_it(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    worker = start_worker(["shutdown"], notes=tmp_path)
    runner = worker.runners[0].identity
    scenarios.ask_to_shut_down(worker)
    wait_for_note(tmp_path, runner.pid, "shutting down")
    scenarios.kill_worker(worker)
    time.sleep(0.1)  # its watchdog records that the ending has begun
    report = sweep(fingerprint=False, grace=0.2)
    (result,) = [result for result in report.results if result.target == runner]
    assert result.signals == () and result.outcome == "exited", result
    assert result.ended == "clean"
    assert [note["event"] for note in read_notes(tmp_path, runner.pid)] == [
        "shutting down",
        "shut down",
        "finally",
    ]
    assert report.elapsed_seconds < GRACE  # it returned at the exit, not at the grace


def test_a_sigterm_does_not_cut_a_clean_ending_short(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    """What a sweep's SIGTERM is to a runner already ending: a request for what is
    under way. It goes at its grace, killed by its watchdog, not by the SIGTERM."""
    worker = start_worker(["hang"], notes=tmp_path)
    runner = worker.runners[0].identity
    killed_at = scenarios.kill_worker(worker)
    wait_for_note(tmp_path, runner.pid, "caught")
    os.kill(runner.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert scenarios.alive([runner]) == [runner], "SIGTERM ended a clean ending"
    gone = scenarios.wait_gone([runner], GRACE + 1.0)[runner]
    assert gone is not None and gone - killed_at >= GRACE


def test_sweep_json_says_how_each_orphan_ended(
    start_worker: StartWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guarded runner whose watch could not act (a thread-only strategy holding the
    GIL) is killed by the sweep: SIGTERM's default action, a kill."""
    worker = start_worker(["gil"], strategy="sentinel")
    runner = worker.runners[0].identity
    scenarios.kill_worker(worker)
    time.sleep(0.2)
    assert cli.main(["sweep", "--json", "--registry-only", "--grace", "0.5"]) == 0
    document = json.loads(capsys.readouterr().out)
    (result,) = [result for result in document["results"] if result["pid"] == runner.pid]
    assert result["ended"] == "killed" and result["signals"] == ["SIGTERM"]
    assert cli.main(["doctor", "--json"]) in (0, 1)
    checks = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    kills = checks["hard kills"]
    assert kills["status"] == "WARN" and str(runner.pid) in kills["detail"], kills
    assert "reboot" in kills["next"]


def test_scan_shows_a_clean_ending_under_way(
    start_worker: StartWorker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = start_worker(["hang"], notes=tmp_path)
    runner = worker.runners[0].identity
    scenarios.kill_worker(worker)
    wait_for_note(tmp_path, runner.pid, "caught")
    time.sleep(0.1)  # its watchdog records that the ending has begun
    assert cli.main(["scan", "--json", "--registry-only"]) == 1
    document = json.loads(capsys.readouterr().out)
    (suspect,) = [s for s in document["suspects"] if s["pid"] == runner.pid]
    ending = suspect["ending"]
    assert ending["event"] == "begun" and 0 < ending["grace_left_s"] <= GRACE, ending
    assert cli.main(["scan", "--registry-only"]) == 1
    assert f"{runner.pid}: ending the clean way" in capsys.readouterr().out


def test_a_sweep_that_waits_says_for_which_runner_why_and_until_when(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    worker = start_worker(["shutdown"], notes=tmp_path)
    runner = worker.runners[0].identity
    scenarios.ask_to_shut_down(worker)
    wait_for_note(tmp_path, runner.pid, "shutting down")
    scenarios.kill_worker(worker)
    time.sleep(0.1)  # its watchdog records that the ending has begun
    lines: list[str] = []
    sweep(fingerprint=False, grace=0.2, on_wait=lines.append)
    (line,) = lines
    assert line.startswith(f"waiting for runner {runner.pid} "), line
    assert "its clean ending has begun" in line and " until " in line, line
