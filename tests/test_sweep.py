"""The sweep on real processes: planted orphans die, decoys live, every time."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records.registry import Registry, RunnerRecord, host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import settings, signalling
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of, liveness
from exo_orphan_guard.system.process_facts import Pid
from exo_orphan_guard.tools import cli
from tests.conftest import StartWorker
from tests.helpers.cli import report_of, run_cli
from tests.helpers.processes import NOBODY, start_deaf_orphan, start_orphan, started_child
from tests.helpers.sweeps import gone, killed_pids, orphaned_runners

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to plant processes")


def cli_sweep(*arguments: str) -> dict[str, Any]:
    return report_of(run_cli("sweep", "--json", *arguments))


# --- planted orphans of each kind are killed ----------------------------------------


@pytest.mark.machine_wide
def test_recorded_runner_whose_watch_could_not_act_is_killed(
    start_worker: StartWorker, isolated_environment: Path
) -> None:
    # A thread-only watch cannot act while the runner holds the GIL: a real orphan.
    worker = start_worker(["gil"], strategy="sentinel")
    runner = worker.runners[0].identity
    orphaned_runners(worker)
    report = sweep(grace=0.2)
    verdict = next(verdict for verdict in report.targets if verdict.pid == runner.pid)
    assert verdict.rule == "registry" and verdict.labels["instance_id"] == "scenario"
    # (Other orphans on this machine may be swept too: assert on ours.)
    assert gone([runner]) and runner.pid in killed_pids(report)
    assert report.exit_code == 0
    assert not any(host_directory(isolated_environment).glob("runner-*.json")), (
        "record of the dead runner kept"
    )


@pytest.mark.machine_wide
def test_unrecorded_exo_runners_and_their_children_are_killed(
    start_worker: StartWorker, exo_python: str
) -> None:
    worker = scenarios.start_worker(["idle", "child"], watch="none", python=exo_python)
    try:
        tracker = [
            identity
            for child in psutil.Process(worker.pid).children()
            if "resource_tracker" in " ".join(child.cmdline())
            for identity in [identity_of(child.pid)]
            if identity is not None
        ]
        members = orphaned_runners(worker)
        report = sweep(grace=0.2)
        runners = {runner.identity.pid for runner in worker.runners}
        ours = [verdict for verdict in report.targets if verdict.pid in runners]
        assert {verdict.pid for verdict in ours} == runners
        assert all(verdict.rule == "fingerprint" for verdict in ours)
        assert gone(members)
        # multiprocessing's resource tracker is no runner: it leaves once they are gone.
        assert len(tracker) == 1 and gone(tracker)
        assert all(result.target.pid != tracker[0].pid for result in report.results)
    finally:
        scenarios.cleanup(worker)


def test_match_any_parent_kills_matching_processes_under_a_live_parent(
    planted: list[ProcessIdentity],
) -> None:
    token = uuid.uuid4().hex
    marker = f"eog-rank-{token}"
    # Like an mlx.launch rank under its sshd: a live parent that is not ours. The
    # parent's own command line must not contain the marker, or --match takes it too.
    launcher = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
        f"'eog-rank-' + '{token}']); time.sleep(600)"
    )
    parent = start_orphan([sys.executable, "-c", launcher])
    planted.append(parent)
    rank = started_child(parent, marker)
    planted.append(rank)
    # Live parent: spared by default. (The fingerprint is off: sweeps are machine-wide.)
    assert sweep(match=marker, grace=0.2, fingerprint=False).targets == ()
    report = sweep(match=re.escape(marker), any_parent=True, grace=0.2, fingerprint=False)
    assert [verdict.rule for verdict in report.targets] == ["match-any-parent"]
    assert gone([rank]) and liveness(parent) == "alive"


def test_an_orphan_that_ignores_sigterm_is_killed_after_the_grace(
    planted: list[ProcessIdentity], tmp_path: Path
) -> None:
    token = f"eog-deaf-{uuid.uuid4().hex}"
    orphan = start_deaf_orphan(token, tmp_path)
    planted.append(orphan)
    report = sweep(match=re.escape(token), grace=0.5, fingerprint=False)
    (result,) = [result for result in report.results if result.target == orphan]
    assert result.outcome == "killed" and result.signals == ("SIGTERM", "SIGKILL")
    assert report.elapsed_seconds >= 0.5 and gone([orphan])


def test_a_sweep_stopped_during_the_grace_still_finishes_the_kill(
    planted: list[ProcessIdentity], tmp_path: Path
) -> None:
    """Stopping ends a sweep's waits for what ends by itself, never a kill it has begun:
    half-sent, it would leave an orphan that ignored SIGTERM running."""
    token = f"eog-deaf-{uuid.uuid4().hex}"
    orphan = start_deaf_orphan(token, tmp_path)
    planted.append(orphan)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    report = sweep(match=re.escape(token), grace=1.0, fingerprint=False, stop=stop)
    assert stop.is_set()
    (result,) = [result for result in report.results if result.target == orphan]
    assert result.outcome == "killed" and result.signals == ("SIGTERM", "SIGKILL")
    assert report.elapsed_seconds >= 1.0 and gone([orphan])


# --- decoys survive ---------------------------------------------------------------


@pytest.mark.machine_wide
def test_decoys_all_survive_a_sweep(
    start_worker: StartWorker,
    exo_python: str,
    planted: list[ProcessIdentity],
    isolated_environment: Path,
) -> None:
    live_guarded = start_worker(["idle", "gil"])  # records, live worker
    live_unguarded = scenarios.start_worker(["idle"], watch="none", python=exo_python)
    foreign_program = scenarios.start_worker(["idle"], watch="none")  # not exo's python
    try:
        decoys = [
            *live_guarded.all_processes(),
            *live_unguarded.all_processes(),
            *foreign_program.all_processes(),
        ]
        # An ordinary orphan; a stranger now holding a recorded runner's pid.
        ordinary = start_orphan(["/bin/sleep", "600"])
        stranger = start_orphan(["/bin/sleep", "601"])
        planted += [ordinary, stranger]
        registry, _ = Registry.open(isolated_environment, create=True)
        assert registry is not None
        dead_worker = ProcessIdentity(live_unguarded.pid, 1.0)
        registry.write(_claim(stranger, dead_worker, started=stranger.started - 5.0))
        # Another user's runner-looking orphan, seen by the fingerprint and by --match.
        token = f"eog-decoy-{uuid.uuid4().hex}"
        nobody = _start_nobody_runner(planted, token)
        decoys += [ordinary, stranger, nobody]
        # --match sees the live workers (their go files are in their command lines)
        # and the other user's orphan, and must spare them all.
        workers = (live_guarded, live_unguarded, foreign_program)
        matching = "|".join([*(re.escape(str(w.go_file)) for w in workers), token])

        # From a separate process, as an operator would: the live workers are then not
        # the sweeper's own descendants, which it would spare for that reason alone.
        reports = [cli_sweep("--grace", "0.2"), cli_sweep("--match", matching)]
        time.sleep(0.3)
        assert scenarios.alive(decoys) == decoys
        decoy_pids = {decoy.pid for decoy in decoys}
        suspects = {suspect["pid"] for report in reports for suspect in report["suspects"]}
        assert not suspects & decoy_pids, reports
        spared = {entry["pid"]: entry["reason"] for entry in reports[0]["spared"]}
        assert "uid" in spared[nobody.pid]
        # exo's runner: its live parent shows exo (the stand-in extension mapped).
        unguarded_runner = live_unguarded.runners[0].identity.pid
        assert spared[unguarded_runner].startswith(f"runner of exo {live_unguarded.pid}")
        # Another program's spawn children are not exo's business at all.
        assert foreign_program.runners[0].identity.pid not in spared
        guarded_runner = live_guarded.runners[0].identity.pid
        assert spared[guarded_runner] == f"its worker {live_guarded.pid} is alive"
        assert not (host_directory(isolated_environment) / f"runner-{stranger.pid}.json").exists()
    finally:
        scenarios.cleanup(live_unguarded)
        scenarios.cleanup(foreign_program)


def test_another_users_process_survives_even_an_explicit_match(
    planted: list[ProcessIdentity],
) -> None:
    token = f"eog-nobody-{uuid.uuid4().hex}"
    nobody = _start_nobody_runner(planted, token)
    report = sweep(match=token, any_parent=True, grace=0.2, fingerprint=False)
    assert nobody.pid not in {verdict.pid for verdict in report.targets}
    assert liveness(nobody) == "alive"


def _start_nobody_runner(planted: list[ProcessIdentity], token: str) -> ProcessIdentity:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("starting a process as another user needs root and setpriv")
    frozen = Path(tempfile.mkdtemp(prefix="eog-nobody-"))
    frozen.chmod(0o755)
    exo = frozen / "exo"  # looks like exo's frozen app to the fingerprint
    exo.symlink_to("/bin/sh")
    identity = start_orphan(
        [str(exo), "-c", "sleep 600; :", "exo", "--multiprocessing-fork", token], user=NOBODY
    )
    planted.append(identity)
    assert psutil.Process(identity.pid).uids().real == NOBODY
    return identity


def _claim(process: ProcessIdentity, worker: ProcessIdentity, *, started: float) -> RunnerRecord:
    return RunnerRecord(
        pid=process.pid,
        started=started,
        boot_id=_boot(),
        uid=os.geteuid(),
        worker=worker,
        exe="/bin/sleep",
        argv=tuple(psutil.Process(process.pid).cmdline()),
        pgid=None,
        recorded_at=time.time(),
        labels={"runner_id": "planted"},
    )


def _boot() -> str:
    return system.boot_id()


# --- registry corruption ------------------------------------------------------------


def test_bad_registry_entries_warn_and_never_cause_a_wrong_kill(
    planted: list[ProcessIdentity], isolated_environment: Path, tmp_path: Path
) -> None:
    """Every bad entry below claims a live decoy as the runner of a dead worker: if the
    sweep trusted any of them, it would kill the decoy."""
    registry, _ = Registry.open(isolated_environment, create=True)
    assert registry is not None
    dead_worker = ProcessIdentity(Pid(os.getpid()), 1.0)
    decoys = [start_orphan(["/bin/sleep", str(600 + index)]) for index in range(4)]
    planted.extend(decoys)
    claims = [_claim(decoy, dead_worker, started=decoy.started) for decoy in decoys]
    root = registry.path
    (root / "runner-1.json").write_bytes(b"{corrupt")
    (root / "runner-2.json").write_bytes(claims[0].to_json()[:50])
    (root / "runner-3.json").write_bytes(os.urandom(100))
    writable = root / f"runner-{decoys[1].pid}.json"
    writable.write_bytes(claims[1].to_json())
    writable.chmod(0o666)
    outside = tmp_path / "outside.json"
    outside.write_bytes(claims[2].to_json())
    (root / f"runner-{decoys[2].pid}.json").symlink_to(outside)
    expected = 5
    if os.geteuid() == 0:
        foreign = root / f"runner-{decoys[3].pid}.json"
        foreign.write_bytes(claims[3].to_json())
        os.chown(foreign, NOBODY, NOBODY)
        expected += 1
    report = sweep(grace=0.2, fingerprint=False)
    assert len(report.warnings) == expected, report.warnings
    assert report.targets == ()
    assert scenarios.alive(decoys) == decoys


def test_an_untrusted_registry_directory_is_not_acted_on(
    planted: list[ProcessIdentity], isolated_environment: Path
) -> None:
    registry, _ = Registry.open(isolated_environment, create=True)
    assert registry is not None
    decoy = start_orphan(["/bin/sleep", "700"])
    planted.append(decoy)
    registry.write(_claim(decoy, ProcessIdentity(Pid(os.getpid()), 1.0), started=decoy.started))
    isolated_environment.chmod(0o777)
    report = sweep(grace=0.2, fingerprint=False)
    assert decoy.pid not in {verdict.pid for verdict in report.targets}
    assert "refusing" in report.warnings[0] and liveness(decoy) == "alive"


# --- survivors and exit codes ---------------------------------------------------------


@pytest.mark.machine_wide
def test_an_injected_survivor_is_reported_unkillable_with_exit_code_1(
    exo_python: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python)
    try:
        (runner,) = orphaned_runners(worker)
        real_send, real_interrupt = signalling.send, signalling.interrupt

        def deaf_to_everything(target: ProcessIdentity, number: int) -> signalling.Delivery:
            return "sent" if target == runner else real_send(target, number)

        def deaf_to_sigint(target: ProcessIdentity) -> signalling.Delivery:
            return "sent" if target == runner else real_interrupt(target)

        monkeypatch.setattr(signalling, "send", deaf_to_everything)
        monkeypatch.setattr(signalling, "interrupt", deaf_to_sigint)

        def not_dying(pid: int) -> bool | None:
            """What Linux and macOS tell of a process no SIGKILL reached."""
            return False if pid == runner.pid else None

        monkeypatch.setattr(system, "is_exiting", not_dying)
        code = cli.main(["sweep", "--json", "--grace", "0.1"])
        document = json.loads(capsys.readouterr().out)
        assert code == 1 and document["exit_code"] == 1
        (result,) = [result for result in document["results"] if result["pid"] == runner.pid]
        assert result["outcome"] == "unkillable" and "reboot" in result["advice"]
        assert liveness(runner) == "alive"
        monkeypatch.setattr(signalling, "send", real_send)
        monkeypatch.setattr(signalling, "interrupt", real_interrupt)
        assert cli.main(["sweep", "--grace", "0.1"]) == 0
        assert gone([runner])
    finally:
        scenarios.cleanup(worker)


def test_scan_lists_and_dry_run_kills_nothing(
    exo_python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python)
    try:
        (runner,) = orphaned_runners(worker)
        assert cli.main(["scan"]) == 1
        table = capsys.readouterr().out
        assert str(runner.pid) in table and "fingerprint" in table and "PID" in table
        assert cli.main(["sweep", "--dry-run", "--json"]) == 1
        document = json.loads(capsys.readouterr().out)
        assert document["schema"] == "exo-orphan-guard/sweep-report/1"
        assert [suspect["pid"] for suspect in document["suspects"]] == [runner.pid]
        assert document["results"] == [] and liveness(runner) == "alive"
    finally:
        scenarios.cleanup(worker)


@pytest.mark.parametrize(
    "argv",
    [["sweep", "--any-parent"], ["scan", "--match", "("], ["sweep", "--grace", "x"], ["nope"], []],
)
def test_usage_errors_are_one_line_with_exit_code_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("moved", ["EXO_HOME", "XDG_CACHE_HOME"])
def test_the_former_registry_is_still_swept_beside_exos_directory(
    moved: str,
    planted: list[ProcessIdentity],
    isolated_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Records a guard wrote before the registry followed exo's directories (in
    ~/.exo/orphan-guard) are read beside those in exo's cache directory (`~/$EXO_HOME`,
    or the XDG cache on Linux): their runners' orphans are killed all the same."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv(settings.DIR_ENV)
    if moved == "EXO_HOME":
        monkeypatch.setenv(settings.EXO_HOME_ENV, ".exo-elsewhere")
        assert settings.registry_dir() == home / ".exo-elsewhere" / "orphan-guard"
    else:
        monkeypatch.delenv(settings.EXO_HOME_ENV, raising=False)
        monkeypatch.setenv(settings.XDG_CACHE_ENV, str(tmp_path / "xdg"))
        assert settings.registry_dir(platform="linux") == tmp_path / "xdg" / "exo" / "orphan-guard"
    former, _ = Registry.open(home / ".exo" / "orphan-guard", create=True)
    assert former is not None
    orphan = start_orphan(["/bin/sleep", "701"])
    planted.append(orphan)
    former.write(_claim(orphan, ProcessIdentity(Pid(os.getpid()), 1.0), started=orphan.started))
    report = sweep(grace=0.2, fingerprint=False)
    assert [verdict.pid for verdict in report.targets] == [orphan.pid], report
    assert liveness(orphan) == "gone"
    assert report.registry is not None
    assert report.registry.parent == settings.registry_dir()
