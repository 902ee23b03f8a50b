"""`assess` on made-up node facts, then one real run against planted orphans."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.exo import patching
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.guardian_state import GuardianState
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.process_table import ProcessInfo
from exo_orphan_guard.sweeper.verdicts import NOT_KNOWN_EXO, Verdict
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.process_facts import Pid
from exo_orphan_guard.tools import cli, doctor, service_status
from exo_orphan_guard.tools.check import Check
from tests.helpers.guardian import stand_in_guardian

RUNNER = ProcessInfo(
    pid=Pid(300),
    ppid=1,
    started=1.0,
    uid=0,
    argv=("/x/python", "--multiprocessing-fork"),
    exe=None,
    status="sleeping",
    rss=2**31,
    create_time=1.0,
    exo_evidence="maps exo's extension exo_rs.abi3.so",
    in_exo_environment=True,
)
GUARDIAN = service_status.GuardianFacts(
    manager="systemd",
    installed=Path("/h/.config/systemd/user/exo-orphan-guard.service"),
    running=GuardianState(Pid(4242), 1.0, "b", 1_800_000_000.0, "service", "0.1.0"),
    lock_held=True,
    directory=Path("/r/host-a"),
    ended=(),
)
HEALTHY = doctor.NodeFacts(
    toggle=settings.Parsed(True),
    patch_status=None,
    patch_error=None,
    exo_tree=None,
    registry_path=Path("/r"),
    registry_problem=None,
    records=0,
    registry_warnings=(),
    verdicts=(),
    runners=(),
    stuck=(),
    guardian=GUARDIAN,
)


def statuses(facts: doctor.NodeFacts) -> dict[str, str]:
    return {check.name: check.status for check in doctor.assess(facts)}


def test_a_healthy_node() -> None:
    assert statuses(HEALTHY) == {
        "guard": "OK",
        "guardian": "OK",
        "settings": "OK",
        "exo patch": "SKIP",
        "orphans": "OK",
        "not known": "OK",
        "unkillable": "OK",
        "hard kills": "OK",
        "endings under way": "OK",
        "registry": "OK",
        "queue pairs": "OK",
        "wired memory": "SKIP",
        "rdma ports": "SKIP",
    }
    assert doctor.exit_code(doctor.assess(HEALTHY)) == 0


def test_orphans_fail_and_say_what_to_run() -> None:
    orphan = Verdict(RUNNER.pid, "kill", "its worker 9 is gone", "registry", RUNNER)
    checks = doctor.assess(dataclasses.replace(HEALTHY, verdicts=(orphan,), runners=(RUNNER,)))
    by_name = {check.name: check for check in checks}
    assert by_name["orphans"].status == "FAIL" and "2.0 GiB" in by_name["orphans"].detail
    assert by_name["orphans"].next_step == "exo-orphan-guard sweep"
    assert by_name["queue pairs"].status == "WARN"
    assert doctor.exit_code(checks) == 1


def test_an_orphan_not_known_to_be_exo_is_listed_with_what_ends_it() -> None:
    reason = f"{NOT_KNOWN_EXO}: nothing shows it runs exo"
    unknown = Verdict(RUNNER.pid, "spare", reason, None, RUNNER, not_known_exo=True)
    checks = doctor.assess(dataclasses.replace(HEALTHY, verdicts=(unknown,)))
    by_name = {check.name: check for check in checks}
    line = by_name["not known"]
    assert line.status == "WARN" and "300" in line.detail and "not known to be exo" in line.detail
    assert "--match" in str(line.next_step) and line.figures == {"pids": [300]}
    assert by_name["orphans"].status == "OK", "never counted as an orphan a sweep ends"
    assert doctor.exit_code(checks) == 0


def test_stuck_processes_say_reboot() -> None:
    checks = doctor.assess(dataclasses.replace(HEALTHY, stuck=((300, "U"),)))
    unkillable = next(check for check in checks if check.name == "unkillable")
    assert unkillable.status == "FAIL" and "reboot" in str(unkillable.next_step)


def test_guard_off_odd_and_registry_problems(tmp_path: Path) -> None:
    # The app's user: no toggle anywhere, a guardian running: an all-clear.
    off = dataclasses.replace(HEALTHY, toggle=settings.Parsed(False))
    assert statuses(off)["guard"] == "OK" and doctor.exit_code(doctor.assess(off)) == 0
    # A patched exo named here, the toggle off: its hooks do nothing.
    series = patching.load_series()[0]
    patched = dataclasses.replace(
        off, exo_tree=tmp_path, patch_status=patching.TreeStatus(series, "applied")
    )
    (guard,) = [check for check in doctor.assess(patched) if check.name == "guard"]
    assert guard.status == "WARN" and "=true" in str(guard.next_step)
    odd = settings.parse_toggle("maybe")
    assert statuses(dataclasses.replace(HEALTHY, toggle=odd))["guard"] == "WARN"
    refused = dataclasses.replace(HEALTHY, registry_problem="orphan registry /r is a symlink")
    assert statuses(refused)["registry"] == "FAIL"
    corrupt = dataclasses.replace(HEALTHY, registry_warnings=("ignoring /r/runner-1.json",))
    assert statuses(corrupt)["registry"] == "WARN"


def test_patch_states(tmp_path: Path) -> None:
    series = patching.load_series()[0]
    applied = dataclasses.replace(
        HEALTHY, exo_tree=tmp_path, patch_status=patching.TreeStatus(series, "applied")
    )
    assert statuses(applied)["exo patch"] == "OK"
    pending = dataclasses.replace(applied, patch_status=patching.TreeStatus(series, "not applied"))
    check = next(check for check in doctor.assess(pending) if check.name == "exo patch")
    assert check.status == "WARN" and "patch apply" in str(check.next_step)
    broken = dataclasses.replace(HEALTHY, exo_tree=tmp_path, patch_error="not an exo source tree")
    assert statuses(broken)["exo patch"] == "FAIL"


@pytest.mark.skipif(sys.platform != "linux", reason="plants processes via /proc")
def test_doctor_on_this_machine_sees_a_planted_orphan(
    tmp_path: Path, exo_python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python)
    try:
        scenarios.kill_worker(worker)
        assert cli.main(["doctor", "--json", "--exo", str(tmp_path)]) == 1
        checks = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
        assert checks["orphans"]["status"] == "FAIL"
        assert str(worker.runners[0].identity.pid) in checks["orphans"]["detail"]
        assert checks["exo patch"]["status"] == "FAIL"  # tmp_path is no exo tree
    finally:
        scenarios.cleanup(worker)


def _ending(pid: int, how: endings.How, why: str, event: endings.Event = "ended") -> endings.Ending:
    return endings.Ending(
        event=event, pid=Pid(pid), started=1.0, boot_id="b", at=1.0, by="watchdog", how=how, why=why
    )


def test_runners_killed_hard_since_boot_are_a_warning_with_the_reboot_advice() -> None:
    seen = (
        _ending(10, "clean", "it exited by itself"),
        _ending(11, "killed", "wedged: ...", event="ended"),
        _ending(12, "clean", "", event="begun"),
        _ending(12, "killed", "its clean ending did not finish within the 10 s grace"),
    )
    (check,) = [
        c
        for c in doctor.assess(dataclasses.replace(HEALTHY, endings=seen))
        if c.name == "hard kills"
    ]
    assert check.status == "WARN" and "2 runner(s) killed hard" in check.detail
    assert "pid 12" in check.detail and "pid 11" in check.detail
    assert check.next_step is not None and "reboot" in check.next_step
    assert check.figures == {"clean": 1, "killed": 2}


def test_clean_endings_alone_are_fine() -> None:
    seen = (_ending(10, "clean", "it exited by itself"),)
    (check,) = [
        c
        for c in doctor.assess(dataclasses.replace(HEALTHY, endings=seen))
        if c.name == "hard kills"
    ]
    assert check.status == "OK" and "1 runner(s) ended cleanly" in check.detail


def test_doctor_shows_both_bounds_in_force_and_any_bad_value() -> None:
    grace = settings.parse_grace("abc")
    busy_wait = settings.parse_busy_wait("30")
    checks = doctor.assess(dataclasses.replace(HEALTHY, grace=grace, busy_wait=busy_wait))
    (check,) = [c for c in checks if c.name == "settings"]
    assert check.status == "WARN", check
    assert f"{settings.GRACE_ENV} 10 s" in check.detail and "'abc'" in check.detail
    assert f"{settings.BUSY_WAIT_ENV} 30 s" in check.detail
    assert check.figures == {"grace_s": 10.0, "busy_wait_s": 30.0}


def test_doctor_on_this_machine_names_a_bad_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.GRACE_ENV, "abc")
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, "2000")
    (check,) = [c for c in doctor.assess(doctor.gather(None)) if c.name == "settings"]
    assert check.status == "WARN"
    assert "EXO_ORPHAN_GUARD_GRACE='abc'" in check.detail
    assert "EXO_ORPHAN_GUARD_BUSY_WAIT='2000'" in check.detail


def _guardian_line(**changes: object) -> Check:
    guardian = dataclasses.replace(GUARDIAN, **changes)
    (check,) = [
        c
        for c in doctor.assess(dataclasses.replace(HEALTHY, guardian=guardian))
        if c.name == "guardian"
    ]
    return check


def test_the_guardian_line_says_whether_it_runs_and_what_to_run_next() -> None:
    killed = endings.Ending(
        "ended", Pid(7), 1.0, "b", 1.0, "guardian", "killed", 1.0, "", step="grace"
    )
    running = _guardian_line(ended=(killed,))
    assert running.status == "OK" and running.next_step is None
    assert running.detail.startswith("pid 4242 since ")
    assert running.detail.endswith(
        "(service mode, version 0.1.0); ended 1 runner(s) since boot: 1 killed (grace 1)"
    )
    assert running.figures == {
        "installed": True,
        "running": True,
        "pid": 4242,
        "ended": 1,
        "killed": 1,
        "linger": None,
    }
    by_hand = _guardian_line(installed=None)
    assert by_hand.status == "OK" and by_hand.next_step == "exo-orphan-guard service install"
    stopped = _guardian_line(running=None, lock_held=False)
    assert stopped.status == "WARN"
    assert stopped.detail == (
        "installed (/h/.config/systemd/user/exo-orphan-guard.service) but not running; "
        "ended none since boot"
    )
    assert stopped.next_step == "exo-orphan-guard service status (says why, and where its log is)"
    absent = _guardian_line(running=None, lock_held=False, installed=None)
    assert (absent.status, absent.detail) == ("WARN", "not installed, not running")
    assert absent.next_step == "exo-orphan-guard service install"
    elsewhere = _guardian_line(running=None, lock_held=False, installed=None, manager=None)
    assert elsewhere.status == "WARN" and elsewhere.next_step == "exo-orphan-guard service run"


def test_the_guardian_line_says_it_waits_for_a_registry_it_cannot_use() -> None:
    problem = "orphan registry /r is writable by others (mode 777): refusing to use it"
    waiting = _guardian_line(running=None, directory=None, registry_problem=problem)
    assert waiting.status == "WARN" and waiting.next_step == service_status.REGISTRY_FIX
    assert waiting.detail == (
        f"not guarding: it cannot use the registry ({problem}); {service_status.WAITING}"
    )
    by_hand = _guardian_line(running=None, directory=None, registry_problem=problem, installed=None)
    assert by_hand.detail == f"not guarding: it cannot use the registry ({problem})"


def test_the_guardian_line_says_when_lingering_is_off() -> None:
    lingering = _guardian_line(linger=False)
    assert lingering.status == "WARN" and lingering.next_step == service_status.ENABLE_LINGER
    assert lingering.detail.endswith(f"; {service_status.LINGER_OFF}")
    assert lingering.figures["linger"] is False
    assert _guardian_line(linger=None).status == "OK"
    by_hand = _guardian_line(linger=False, installed=None)  # nothing for systemd to stop
    assert by_hand.status == "OK" and service_status.LINGER_OFF not in by_hand.detail
    stopped = _guardian_line(running=None, linger=False)
    assert stopped.detail.endswith(service_status.LINGER_OFF)


def test_doctor_on_this_machine_finds_a_real_guardian_and_its_stale_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    registry, _ = Registry.open(settings.registry_dir(), create=True)
    assert registry is not None
    with stand_in_guardian(registry.path) as guardian:
        (line,) = [c for c in doctor.assess(doctor.gather(None)) if c.name == "guardian"]
        assert line.status == "OK" and line.detail.startswith(f"pid {guardian.pid} since ")
        assert line.next_step == "exo-orphan-guard service install"
    (line,) = [c for c in doctor.assess(doctor.gather(None)) if c.name == "guardian"]
    assert (line.status, line.detail) == ("WARN", "not installed, not running")


def test_doctor_on_this_machine_says_the_guardian_cannot_use_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "registry"
    base.mkdir()
    base.chmod(0o777)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(settings.DIR_ENV, str(base))
    (line,) = [c for c in doctor.assess(doctor.gather(None)) if c.name == "guardian"]
    assert line.status == "WARN" and line.next_step == service_status.REGISTRY_FIX
    assert line.detail.startswith(
        f"not guarding: it cannot use the registry (orphan registry {base} is writable by "
        "others (mode 777)"
    )
