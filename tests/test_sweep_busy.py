"""Sweeps and runners busy in native code, on real processes: a sweep waits for a busy
orphan as its watchdog does (and says so, one line naming the runner, why and until
when), neither killing it early nor waiting past its watchdog's bound; `sweep --now`
kills at once and warns; `scan` and `doctor` show the wait."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import Registry, host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.native_calls import GIL_BUSY_SECONDS
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.sweeper.engine import EXIT_SETTLE_SECONDS
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import liveness
from exo_orphan_guard.system.process_facts import Pid
from exo_orphan_guard.tools import cli
from tests.conftest import StartWorker
from tests.helpers.cli import run_cli
from tests.helpers.sweeps import busy_orphan
from tests.helpers.waiting import wait_for_note

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

GRACE = 3.0
BUSY_WAIT = 2.0


@pytest.fixture(autouse=True)
def bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.GRACE_ENV, str(GRACE))
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, str(BUSY_WAIT))


def test_a_sweep_waits_for_a_busy_orphan_until_it_returns_and_ends_clean(
    start_worker: StartWorker,
    isolated_environment: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sweep starts before the watchdog has recorded the runner busy (0.5 s after
    the notice): it reads the endings again when its first, short deadline is out,
    instead of sending a SIGTERM that would kill the runner (no handler for it yet).
    It says the runner is busy exactly where the watchdog recorded it so. On a loaded
    machine the notice can come in the native call's last 0.5 s: the runner is back
    in Python before it could be recorded busy, and ends clean all the same."""
    worker = start_worker(["gilbusy"], notes=tmp_path)
    runner = worker.runners[0].identity
    wait_for_note(tmp_path, runner.pid, "native begun")
    scenarios.kill_worker(worker)
    assert cli.main(["sweep", "--json", "--registry-only", "--grace", "0.2"]) == 0
    captured = capsys.readouterr()
    (result,) = [r for r in json.loads(captured.out)["results"] if r["pid"] == runner.pid]
    assert result["signals"] == [] and result["ended"] == "clean", result
    events = [note["event"] for note in read_notes(tmp_path, runner.pid)]
    assert events[-2:] == ["raised", "finally"], events
    waits = [line for line in captured.err.splitlines() if f"runner {runner.pid}" in line]
    assert waits, captured.err
    assert all("waiting for" in line and "until" in line for line in waits), waits
    recorded = endings.read(
        host_directory(isolated_environment) / endings.ENDINGS_NAME, system.boot_id()
    )
    recorded_busy = any(ending.identity == runner and ending.event == "busy" for ending in recorded)
    said_busy = any("busy in native code" in line and "GIL held" in line for line in waits)
    assert said_busy == recorded_busy, (waits, recorded)
    assert GIL_BUSY_SECONDS < BUSY_WAIT


def test_a_sweep_waits_for_one_that_never_returns_only_until_its_watchdog_kills_it(
    start_worker: StartWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = start_worker(["gil"])
    runner = worker.runners[0].identity
    time.sleep(scenarios.GIL_SETTLE_SECONDS)
    killed_at = scenarios.kill_worker(worker)
    time.sleep(0.7)  # recorded busy
    assert cli.main(["sweep", "--json", "--registry-only", "--grace", "0.2"]) == 0
    took = time.monotonic() - killed_at
    (result,) = [
        r for r in json.loads(capsys.readouterr().out)["results"] if r["pid"] == runner.pid
    ]
    assert result["signals"] == [] and result["outcome"] == "exited", result
    assert result["ended"] == "killed", result  # by its watchdog, at the busy wait
    assert took >= BUSY_WAIT, took  # not before it


def test_sweep_now_kills_a_busy_orphan_at_once_and_warns(
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch, isolated_environment: Path
) -> None:
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, "300")
    runner = busy_orphan(start_worker, isolated_environment)
    began = time.monotonic()
    completed = run_cli(
        "sweep", "--now", "--json", "--registry-only", env=dict(os.environ), timeout=120
    )
    # Far from the busy wait's 300 s: at most the kill wait and a slow teardown's wait.
    assert time.monotonic() - began < 2.0 + EXIT_SETTLE_SECONDS + 30.0
    assert "wired Metal memory" in completed.stderr and "reboot" in completed.stderr, (
        completed.stderr
    )
    assert "sweep: waiting for" not in completed.stderr
    (result,) = [r for r in json.loads(completed.stdout)["results"] if r["pid"] == runner.pid]
    assert result["signals"] == ["SIGKILL"], result
    assert result["ended"] == "killed", result
    assert scenarios.wait_gone([runner], EXIT_SETTLE_SECONDS)[runner] is not None


def test_scan_shows_a_runner_busy_in_native_code(
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, "60")
    worker = start_worker(["gil"])
    runner = worker.runners[0].identity
    time.sleep(scenarios.GIL_SETTLE_SECONDS)
    scenarios.kill_worker(worker)
    time.sleep(1.5)
    assert cli.main(["scan", "--json", "--registry-only"]) == 1
    (suspect,) = [
        s for s in json.loads(capsys.readouterr().out)["suspects"] if s["pid"] == runner.pid
    ]
    ending = suspect["ending"]
    assert ending["event"] == "busy" and ending["gil"] == "held", ending
    assert 1.0 <= ending["busy_s"] < 10.0 and ending["busy_wait_s"] == 60.0, ending
    assert cli.main(["scan", "--registry-only"]) == 1
    text = capsys.readouterr().out
    assert f"{runner.pid}: ending: busy in native code" in text, text
    assert "GIL held; killed at 60 s unless it returns" in text, text
    assert cli.main(["doctor", "--json"]) in (0, 1)
    checks = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    under_way = checks["endings under way"]
    assert under_way["status"] == "WARN" and f"pid {runner.pid} busy" in under_way["detail"]
    assert "sweep --now" in under_way["next"]
    os.kill(runner.pid, 9)


def test_a_stopped_sweep_leaves_a_busy_orphan_to_its_watchdog_and_keeps_its_record(
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch, isolated_environment: Path
) -> None:
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, "60")
    runner = busy_orphan(start_worker, isolated_environment)
    stop = threading.Event()
    waits: list[str] = []

    def waiting(line: str) -> None:
        waits.append(line)
        stop.set()  # as exo's cancellation would, once the sweep waits

    report = sweep(fingerprint=False, grace=0.2, on_wait=waiting, stop=stop)
    assert report.elapsed_seconds < 5.0 and waits, report
    assert report.left_to_end == (runner,) and report.results == (), report
    assert report.exit_code == 1 and "left to their watchdogs" in report.summary()
    assert liveness(runner) == "alive" and system.is_stopped(runner.pid) is False
    record = host_directory(isolated_environment) / f"runner-{runner.pid}.json"
    assert record.exists(), "the record of a runner still ending must stay"
    os.kill(runner.pid, 9)


def test_a_stopped_sweep_gives_up_waiting_for_the_lock(isolated_environment: Path) -> None:
    registry, _ = Registry.open(isolated_environment, create=True)
    assert registry is not None
    stop = threading.Event()
    with registry.locked(1.0):
        threading.Timer(0.2, stop.set).start()
        report = sweep(fingerprint=False, lock_timeout=30.0, stop=stop)
    assert report.lock_acquired is False and report.elapsed_seconds < 15.0, report  # not the 30 s


# --- what a sweep waits until (pure) -----------------------------------------------------


def _line(event: endings.Event, deadline: float | None) -> endings.Ending:
    return endings.Ending(
        event=event, pid=Pid(7), started=1.0, boot_id="b", at=0.0, by="watchdog", deadline=deadline
    )


def test_a_busy_line_is_waited_for_to_its_deadline_a_begun_one_within_the_grace() -> None:
    now = 100.0
    busy = _line("busy", now + 130.0)  # the busy wait, then the grace
    assert endings.clean_deadline(busy, 10.0, now, settings.WEDGE_SECONDS) == now + 130.0
    begun = _line("begun", now + 30.0)
    assert endings.clean_deadline(begun, 10.0, now, settings.WEDGE_SECONDS) == now + 10.0
    nothing_yet = endings.clean_deadline(None, 10.0, now, settings.WEDGE_SECONDS)
    assert nothing_yet == now + settings.WEDGE_SECONDS + 0.5


def test_a_sweep_never_waits_forever_on_a_line() -> None:
    now = 100.0
    far = _line("busy", now + 1e9)  # a corrupt or hostile line
    limit = now + settings.MAX_BUSY_WAIT_SECONDS + settings.MAX_GRACE_SECONDS
    assert endings.clean_deadline(far, 10.0, now, settings.WEDGE_SECONDS) == limit
    assert endings.recorded_deadline(far, now) == limit
    assert endings.recorded_deadline(_line("busy", now - 1.0), now) is None  # stale
    assert endings.recorded_deadline(_line("ended", now + 5.0), now) is None
    assert endings.recorded_deadline(None, now) is None
