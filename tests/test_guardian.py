"""The guardian (`service run`) on real processes: exo-shaped workers (an environment
the sweep takes for exo's) with unguarded runners, really SIGKILLed, and the process
table checked. Each case has its control: without the guardian the runners live on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import handover_marker
from exo_orphan_guard.rig import notes as runner_notes
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of, liveness
from tests.helpers.guardian import RunningGuardian, ended_line, guardian, guardian_endings
from tests.helpers.processes import NOBODY, start_orphan
from tests.helpers.waiting import wait_until

# A guardian sweeps the machine at its start and ends any exo orphan it finds.
pytestmark = [
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc"),
]
GONE_WITHIN = 10.0
"""Generous: what it takes is measured in `make bench` (docs/benchmarks.md)."""


def _start(
    kinds: list[scenarios.RunnerKind], exo_python: str, notes: Path, registry: Path
) -> scenarios.StartedWorker:
    return scenarios.start_worker(
        kinds, watch="none", python=exo_python, notes=notes, registry=registry
    )


def _gone(runners: list[ProcessIdentity], seconds: float) -> bool:
    return all(at is not None for at in scenarios.wait_gone(runners, seconds).values())


def _events(notes: Path, runner: ProcessIdentity) -> list[str]:
    return [str(note["event"]) for note in runner_notes.read_notes(notes, runner.pid)]


def test_an_idle_runner_of_a_killed_exo_exits_through_python(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    with guardian(isolated_environment) as running:
        worker = _start(["idle", "idle"], exo_python, notes, isolated_environment)
        try:
            running.watching(worker.pid)
            runners = [runner.identity for runner in worker.runners]
            killed_at = scenarios.kill_worker(worker)
            exits = scenarios.wait_gone(runners, GONE_WITHIN)
            assert all(at is not None for at in exits.values()), running.lines
            # No hand-over marker: SIGINT at once, far inside the grace (10 s).
            assert max(at - killed_at for at in exits.values() if at is not None) < 5.0
            for runner in runners:
                assert "atexit" in _events(notes, runner), "it was killed, not unwound"
                line = ended_line(isolated_environment, runner)
                assert line is not None, running.lines
                assert (line.how, line.signal, line.step) == ("clean", "SIGINT", "interrupt")
        finally:
            scenarios.cleanup(worker)


def test_runners_that_hand_themselves_their_shutdown_get_the_grace_before_sigint(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    """exo's hooks wrote the hand-over marker: the guardian leaves its runners alone
    for the grace, so that no SIGINT cuts exo's own `Runner.shutdown` short; this
    stand-in takes no Shutdown, so it gets the SIGINT then, and unwinds."""
    with guardian(isolated_environment, EXO_ORPHAN_GUARD_GRACE="2") as running:
        worker = _start(["idle"], exo_python, notes, isolated_environment)
        try:
            marker = handover_marker.marker_path(isolated_environment, worker.pid)
            marker.parent.mkdir(mode=0o700, exist_ok=True)
            marker.write_text(json.dumps({"pid": worker.pid, "at": time.time()}))
            marker.chmod(0o600)
            # Said as it is first watched, or by a later scan if the marker came after.
            running.wait_for(rf"exo {worker.pid}\b.*hand themselves their Shutdown")
            (runner,) = [runner.identity for runner in worker.runners]
            killed_at = scenarios.kill_worker(worker)
            gone_at = scenarios.wait_gone([runner], GONE_WITHIN)[runner]
            assert gone_at is not None and gone_at - killed_at >= 2.0, running.lines
            line = ended_line(isolated_environment, runner)
            assert line is not None and (line.how, line.signal) == ("clean", "SIGINT")
            assert wait_until(lambda: not marker.exists(), 5.0), "the marker outlived its exo"
        finally:
            scenarios.cleanup(worker)


def test_without_a_guardian_the_runners_of_a_killed_exo_live_on(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    """The control: the stand-ins orphan as exo's runners do."""
    worker = _start(["idle"], exo_python, notes, isolated_environment)
    try:
        runners = [runner.identity for runner in worker.runners]
        scenarios.kill_worker(worker)
        assert not _gone(runners, 3.0)
    finally:
        scenarios.cleanup(worker)


def test_a_runner_in_a_long_native_call_is_ended_only_once_the_call_returns(
    exo_python: str, notes: Path, isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Busy, not wedged: SIGINT waits for the call to return, then unwinds it."""
    monkeypatch.setenv("EOG_NATIVE_SECONDS", "3")
    with guardian(isolated_environment, EXO_ORPHAN_GUARD_BUSY_WAIT="30") as running:
        worker = _start(["gilfree"], exo_python, notes, isolated_environment)
        try:
            running.watching(worker.pid)
            (runner,) = [runner.identity for runner in worker.runners]
            scenarios.kill_worker(worker)
            assert _gone([runner], GONE_WITHIN + 3), running.lines
            events = _events(notes, runner)
            assert "atexit" in events
            line = ended_line(isolated_environment, runner)
            assert line is not None and (line.how, line.signal) == ("clean", "SIGINT")
        finally:
            scenarios.cleanup(worker)


def test_a_wedged_runner_is_killed_at_the_busy_wait(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    with guardian(
        isolated_environment, EXO_ORPHAN_GUARD_BUSY_WAIT="1", EXO_ORPHAN_GUARD_GRACE="1"
    ) as running:
        worker = _start(["wedged"], exo_python, notes, isolated_environment)
        try:
            running.watching(worker.pid)
            (runner,) = [runner.identity for runner in worker.runners]
            killed_at = scenarios.kill_worker(worker)
            assert _gone([runner], GONE_WITHIN), running.lines
            assert time.monotonic() - killed_at >= 1.0
            line = ended_line(isolated_environment, runner)
            assert line is not None
            assert (line.how, line.signal, line.step) == ("killed", "SIGKILL", "busy_wait")
        finally:
            scenarios.cleanup(worker)


IGNORING_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]
"""What a non-interactive shell does to a job it starts with `&`: SIGINT ignored,
through exec and into every runner exo spawns."""


def test_a_runner_that_ignores_sigint_gets_sigterm_not_the_busy_wait(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    """A worker started in the background from a script that sets no SIGINT handler
    of its own before its runners (exo's `Node.run` does): SIGINT cannot end them, so
    waiting out the busy wait (here 60 s) would only delay the kill."""
    if system.BACKEND != "linux":
        pytest.skip("only Linux shows another process's signal dispositions (a limit)")
    env = {"EXO_ORPHAN_GUARD_BUSY_WAIT": "60", "EXO_ORPHAN_GUARD_GRACE": "1"}
    with guardian(isolated_environment, **env) as running:
        worker = scenarios.start_worker(
            ["idle"],
            watch="none",
            python=exo_python,
            notes=notes,
            registry=isolated_environment,
            launcher=IGNORING_SIGINT,
        )
        try:
            running.watching(worker.pid)
            (runner,) = [runner.identity for runner in worker.runners]
            scenarios.kill_worker(worker)
            assert _gone([runner], GONE_WITHIN), running.lines
            line = ended_line(isolated_environment, runner)
            assert line is not None and (line.how, line.signal) == ("killed", "SIGTERM")
        finally:
            scenarios.cleanup(worker)


def test_of_two_exo_processes_only_the_killed_ones_runners_end(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    with guardian(isolated_environment) as running:
        killed = _start(["idle"], exo_python, notes, isolated_environment)
        living = _start(["idle", "idle"], exo_python, notes, isolated_environment)
        try:
            running.watching(killed.pid)
            running.watching(living.pid)
            scenarios.kill_worker(killed)
            assert _gone([runner.identity for runner in killed.runners], GONE_WITHIN)
            time.sleep(1.0)  # what a wrong kill would need, and a scan more
            for runner in living.runners:
                assert liveness(runner.identity) == "alive"
            assert living.process.poll() is None
        finally:
            scenarios.cleanup(killed)
            scenarios.cleanup(living)


def test_a_guardian_killed_while_exo_lives_ends_the_orphans_when_started_again(
    exo_python: str, notes: Path, isolated_environment: Path
) -> None:
    """As `KeepAlive` restarts it: its start-up sweep ends what was orphaned
    meanwhile, and it still catches a later worker's death."""
    first = RunningGuardian({**os.environ})
    first.wait_for("watching for exo")
    worker = _start(["idle"], exo_python, notes, isolated_environment)
    later = _start(["idle"], exo_python, notes, isolated_environment)
    try:
        first.watching(worker.pid)
        os.kill(first.pid, signal.SIGKILL)
        first.process.wait()
        runners = [runner.identity for runner in worker.runners]
        scenarios.kill_worker(worker)
        assert not _gone(runners, 1.0), "nothing should end them while no guardian runs"
        with guardian(isolated_environment) as again:
            assert _gone(runners, GONE_WITHIN), again.lines
            assert "atexit" in _events(notes, runners[0])
            again.watching(later.pid)
            scenarios.kill_worker(later)
            assert _gone([runner.identity for runner in later.runners], GONE_WITHIN)
    finally:
        first.stop()
        scenarios.cleanup(worker)
        scenarios.cleanup(later)


def test_a_second_guardian_waits_and_takes_over_without_exiting(
    isolated_environment: Path, exo_python: str, notes: Path
) -> None:
    with guardian(isolated_environment) as running:
        second = RunningGuardian({**os.environ})
        try:
            second.wait_for("another guardian holds")
            time.sleep(0.5)
            assert second.process.poll() is None, "a second guardian must not exit"
            assert running.stop() == 0
            second.wait_for("watching for exo")
            worker = _start(["idle"], exo_python, notes, isolated_environment)
            try:
                second.watching(worker.pid)
                scenarios.kill_worker(worker)
                assert _gone([runner.identity for runner in worker.runners], GONE_WITHIN)
            finally:
                scenarios.cleanup(worker)
        finally:
            assert second.stop() == 0


def test_a_reparented_spawn_child_that_is_not_exos_survives_the_guardian(
    isolated_environment: Path, planted: list[ProcessIdentity]
) -> None:
    innocent = start_orphan(
        [sys.executable, "-c", "import time; time.sleep(600)", "--multiprocessing-fork"]
    )
    planted.append(innocent)
    with guardian(isolated_environment) as running:
        running.wait_for("start-up sweep|watching for exo")
        time.sleep(2.5)  # the start-up sweep and a scan
        assert liveness(innocent) == "alive", running.lines


def test_another_users_exo_orphan_and_a_dead_exos_resource_tracker_are_never_signalled(
    isolated_environment: Path,
    planted: list[ProcessIdentity],
    exo_python: str,
    notes: Path,
) -> None:
    """Another user's orphan that looks like the frozen app's runner (its spawner is
    gone), and multiprocessing's resource tracker of a killed exo (not a runner: it
    leaves by itself once no runner holds its pipe)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("starting a process as another user needs root and setpriv")
    frozen = Path(tempfile.mkdtemp(prefix="eog-nobody-"))
    try:
        frozen.chmod(0o755)
        exo = frozen / "exo"  # looks like exo's frozen app to the fingerprint
        exo.symlink_to("/bin/sh")
        nobody = start_orphan(
            [str(exo), "-c", "sleep 600; :", "exo", "--multiprocessing-fork"], user=NOBODY
        )
        planted.append(nobody)
        with guardian(isolated_environment) as running:
            worker = _start(["idle"], exo_python, notes, isolated_environment)
            try:
                tracker = [
                    identity
                    for child in psutil.Process(worker.pid).children()
                    if "resource_tracker" in " ".join(child.cmdline())
                    for identity in [identity_of(child.pid)]
                    if identity is not None
                ]
                running.watching(worker.pid)
                scenarios.kill_worker(worker)
                runners = [runner.identity for runner in worker.runners]
                assert _gone(runners, GONE_WITHIN), running.lines
                assert len(tracker) == 1 and _gone(tracker, GONE_WITHIN)
                ended = {line.pid for line in guardian_endings(isolated_environment)}
                assert tracker[0].pid not in ended and nobody.pid not in ended
                time.sleep(2.5)  # a scan more
                assert liveness(nobody) == "alive", running.lines
            finally:
                scenarios.cleanup(worker)
    finally:
        shutil.rmtree(frozen, ignore_errors=True)
