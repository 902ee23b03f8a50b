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

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.rig.scenario_worker import SHUTDOWN_SECONDS_ENV
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.tools import cli
from tests.conftest import StartWorker
from tests.helpers.waiting import wait_for_note, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

GRACE = 3.0
LONG_GRACE = 20.0


@pytest.fixture(autouse=True)
def graced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.GRACE_ENV, str(GRACE))


def test_a_sweep_waits_for_a_shutdown_under_way_instead_of_killing_it(
    start_worker: StartWorker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shutdown lasts until the sweep says it waits for it (within a long grace),
    so that a loaded machine cannot let it end before the sweep looks."""
    monkeypatch.setenv(settings.GRACE_ENV, str(LONG_GRACE))
    worker = start_worker(
        ["shutdown"], notes=tmp_path, extra_env={SHUTDOWN_SECONDS_ENV: str(LONG_GRACE)}
    )
    runner = worker.runners[0].identity
    scenarios.ask_to_shut_down(worker)
    wait_for_note(tmp_path, runner.pid, "shutting down")
    scenarios.kill_worker(worker)
    wait_for_ending_begun(runner)
    waits: list[str] = []

    def waiting(line: str) -> None:
        waits.append(line)
        scenarios.finish_shutdown(worker)

    report = sweep(fingerprint=False, grace=0.2, on_wait=waiting)
    assert waits, "the sweep did not wait for the shutdown under way"
    (result,) = [result for result in report.results if result.target == runner]
    assert result.signals == () and result.outcome == "exited", result
    assert result.ended == "clean"
    assert [note["event"] for note in read_notes(tmp_path, runner.pid)] == [
        "shutting down",
        "shut down",
        "finally",
    ]
    assert report.elapsed_seconds < LONG_GRACE  # it returned at the exit, not at the grace


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
    gone = scenarios.wait_gone([runner], GRACE + 3.0)[runner]
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
    wait_for_ending_begun(runner)
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
    wait_for_ending_begun(runner)
    lines: list[str] = []
    sweep(fingerprint=False, grace=0.2, on_wait=lines.append)
    (line,) = lines
    assert line.startswith(f"waiting for runner {runner.pid} "), line
    assert "its clean ending has begun" in line and " until " in line, line


def wait_for_ending_begun(runner: ProcessIdentity, timeout: float = 10.0) -> None:
    """Once the runner's watchdog has recorded that its clean ending has begun: what a
    sweep reads to wait rather than signal (a fixed sleep here once lost that race)."""
    path = host_directory(settings.registry_dir()) / endings.ENDINGS_NAME

    def begun() -> bool:
        ending = endings.latest(endings.read(path, system.boot_id())).get(runner)
        return ending is not None and ending.event == "begun"

    assert wait_until(begun, timeout), f"runner {runner.pid}'s ending was never recorded begun"
