"""The CLI's sweep ends an unguarded exo runner with SIGINT first: KeyboardInterrupt
unwinds it through Python (its atexit runs), where SIGTERM's default action ran none.
Then the busy wait, then SIGKILL; `--now` as before. Real processes, and the pure
half (which step, how it is named) on made-up verdicts."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import notes as runner_notes
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.engine import FirstStep
from exo_orphan_guard.sweeper.sweep_endings import Bounds, ended_step, first_step
from exo_orphan_guard.sweeper.verdicts import Verdict
from exo_orphan_guard.system import boot_id, settings
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid
from tests.helpers.cli import report_of, run_cli
from tests.helpers.snapshots import proc
from tests.helpers.sweeps import orphaned_runners


def _sweep(*arguments: str) -> dict[str, Any]:
    return report_of(run_cli("sweep", "--json", *arguments))


def _result_of(report: dict[str, Any], runner: ProcessIdentity) -> dict[str, Any]:
    (result,) = [result for result in report["results"] if result["pid"] == runner.pid]
    return result


def _line_of(registry: Path, runner: ProcessIdentity) -> endings.Ending:
    path = host_directory(registry) / endings.ENDINGS_NAME
    (line,) = [
        ending
        for ending in endings.read(path, boot_id())
        if ending.identity == runner and ending.event == "ended"
    ]
    return line


def _events(notes: Path, runner: ProcessIdentity) -> list[str]:
    return [str(note["event"]) for note in runner_notes.read_notes(notes, runner.pid)]


@pytest.mark.machine_wide
@pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc")
def test_an_idle_unguarded_runner_is_unwound_by_sigint(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python, notes=notes)
    try:
        (runner,) = orphaned_runners(worker)
        result = _result_of(_sweep(), runner)
        assert (result["ended"], result["signal"], result["signals"]) == (
            "clean",
            "SIGINT",
            ["SIGINT"],
        )
        assert "atexit" in _events(notes, runner), "SIGTERM's default action runs no Python"
        line = _line_of(isolated_environment, runner)
        assert (line.how, line.signal, line.step, line.by) == (
            "clean",
            "SIGINT",
            "interrupt",
            "sweep",
        )
    finally:
        scenarios.cleanup(worker)


@pytest.mark.machine_wide
@pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc")
def test_a_runner_that_does_not_take_sigint_is_killed_at_the_busy_wait(
    exo_python: str, notes: Path, isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXO_ORPHAN_GUARD_BUSY_WAIT", "1")
    monkeypatch.setenv("EXO_ORPHAN_GUARD_GRACE", "1")
    worker = scenarios.start_worker(["wedged"], watch="none", python=exo_python, notes=notes)
    try:
        (runner,) = orphaned_runners(worker)
        began = time.monotonic()
        result = _result_of(_sweep(), runner)
        assert time.monotonic() - began >= 1.0
        assert (result["ended"], result["signal"], result["signals"]) == (
            "killed",
            "SIGKILL",
            ["SIGINT", "SIGKILL"],
        )
        line = _line_of(isolated_environment, runner)
        assert (line.how, line.signal, line.step) == ("killed", "SIGKILL", "busy_wait")
    finally:
        scenarios.cleanup(worker)


@pytest.mark.machine_wide
@pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc")
def test_now_still_kills_at_once(exo_python: str, notes: Path) -> None:
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python, notes=notes)
    try:
        (runner,) = orphaned_runners(worker)
        result = _result_of(_sweep("--now"), runner)
        assert (result["ended"], result["signal"], result["signals"]) == (
            "killed",
            "SIGKILL",
            ["SIGKILL"],
        )
        assert "atexit" not in _events(notes, runner)
    finally:
        scenarios.cleanup(worker)


# --- the pure half -----------------------------------------------------------------


def _verdict(pid: int, rule: Any, action: Any = "kill") -> Verdict:
    return Verdict(Pid(pid), action, "why", rule, proc(pid))


def test_only_unrecorded_exo_runners_get_sigint_and_the_busy_wait() -> None:
    verdicts = [
        _verdict(10, "fingerprint"),
        _verdict(11, "registry"),
        _verdict(12, "match"),
        _verdict(13, None, "spare"),
    ]
    bounds = Bounds(grace=10.0, interrupt_wait=120.0, kill_wait=2.0)
    by_pid = {v.pid: first_step(v, bounds) for v in verdicts if v.action == "kill"}
    assert by_pid == {
        10: FirstStep("SIGINT", 120.0),
        11: FirstStep("SIGTERM", 10.0),
        12: FirstStep("SIGTERM", 10.0),
    }
    # One that ignores SIGINT (started in the background from a script): SIGTERM.
    deaf = Verdict(Pid(14), "kill", "why", "fingerprint", replace(proc(14), ignores_sigint=True))
    assert first_step(deaf, bounds).signal == "SIGTERM"


def test_after_sigint_a_runner_has_the_busy_wait_and_never_less_than_the_grace() -> None:
    assert settings.interrupt_bound(120.0, 10.0) == 120.0
    # EXO_ORPHAN_GUARD_BUSY_WAIT=0 would kill a runner half-way through its unwinding.
    assert settings.interrupt_bound(0.0, 10.0) == 10.0
    assert settings.interrupt_bound(0.0, 0.0) == settings.WEDGE_SECONDS


@pytest.mark.parametrize(
    ("signals", "step"),
    [
        (("SIGINT",), "interrupt"),
        (("SIGINT", "SIGKILL"), "busy_wait"),
        (("SIGTERM", "SIGKILL"), "grace"),
        (("SIGKILL",), "at_once"),
        (("SIGTERM",), None),
        ((), None),
    ],
)
def test_the_step_is_named_from_the_signals_sent(signals: tuple[str, ...], step: Any) -> None:
    assert ended_step(signals) == step
