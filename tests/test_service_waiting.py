"""Months unattended: a guardian run as a service waits for a registry it cannot use
instead of exiting into launchd's or systemd's restart loop (a real `service run`), and
`service status` says why it guards nothing; systemd lingering, off, is said by
`install` and `status` (loginctl faked)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from exo_orphan_guard.guardian import registry_wait
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.system import settings
from exo_orphan_guard.tools import service, service_status
from tests.helpers.guardian import READY, RunningGuardian, guardian_home
from tests.helpers.service_fakes import ENVIRON, FakeManager, context_for, redirected_home


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return redirected_home(tmp_path, monkeypatch)


def refused_registry(tmp_path: Path) -> Path:
    """A registry as exFAT or SMB shows it: mode 777, refused by every reader."""
    base = tmp_path / "registry"
    base.mkdir()
    base.chmod(0o777)
    return base


def test_a_service_guardian_waits_says_why_once_and_guards_once_it_can(tmp_path: Path) -> None:
    base = refused_registry(tmp_path)
    environment = {**os.environ, settings.DIR_ENV: str(base), "HOME": str(tmp_path)}
    running = RunningGuardian(environment, "--mode", "service")
    try:
        line = running.wait_for("cannot guard yet: ")
        assert f"orphan registry {base} is writable by others (mode 777)" in line
        assert os.listdir(base) == []  # it writes nothing into what it refuses
        base.chmod(0o700)
        running.wait_for(f"the registry {base}/host-.* can be used now: guarding")
        running.wait_for(READY)
        said = [line for line in running.lines if "cannot guard yet" in line]
        assert len(said) == 1, running.lines
        assert running.process.poll() is None
    finally:
        assert running.stop() == 0


def test_stopped_while_waiting_it_exits_0_having_written_nothing(tmp_path: Path) -> None:
    base = refused_registry(tmp_path)
    environment = {**os.environ, settings.DIR_ENV: str(base), "HOME": str(tmp_path)}
    running = RunningGuardian(environment, "--mode", "service")
    try:
        running.wait_for("cannot guard yet: ")
    finally:
        assert running.stop() == 0
    assert running.lines[-1].endswith("exo-orphan-guard guardian: stopped")
    assert os.listdir(base) == []


def test_by_hand_it_exits_2_at_once(tmp_path: Path) -> None:
    base = refused_registry(tmp_path)
    environment = {**os.environ, settings.DIR_ENV: str(base), "HOME": str(tmp_path)}
    running = RunningGuardian(environment, "--mode", "foreground")
    assert running.process.wait(timeout=60) == 2
    running.wait_for(f"cannot guard: orphan registry {base} is writable by others")


class _Clock(threading.Event):
    """Never set: each wait returns at once, recording how long it was asked to be."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return False


def test_the_wait_backs_off_to_a_minute_and_says_each_reason_once(tmp_path: Path) -> None:
    directory = tmp_path / "usable"
    directory.mkdir(mode=0o700)
    answers: list[tuple[Registry | None, str | None]] = [
        *[(None, "A")] * 7,
        (None, "B"),
        (Registry(directory), None),
    ]
    said: list[str] = []
    clock = _Clock()
    found = registry_wait.wait_for_registry(lambda: answers.pop(0), clock, said.append)
    assert found is not None and found.path == directory and not answers
    assert clock.waits == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert [line.split(";")[0] for line in said] == [
        "cannot guard yet: A",
        "cannot guard yet: B",
        f"the registry {directory} can be used now: guarding",
    ]


def test_a_lock_file_it_cannot_open_is_a_reason_to_wait(tmp_path: Path) -> None:
    base = tmp_path / "registry"
    home = guardian_home()
    (home / "guardian.lock").mkdir()  # opening it for writing fails
    found, problem = registry_wait.usable_registry(base)
    assert found is None and problem is not None
    assert problem.startswith(f"guardian directory {home}: cannot open ")


def test_status_explains_a_guardian_waiting_for_its_registry(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home)
    context = context_for("systemd", fake)
    assert service.install(context) == 0
    registry = home / ".exo-test/orphan-guard"
    registry.mkdir()
    registry.chmod(0o777)
    capsys.readouterr()
    assert service.status(context) == 1
    said = capsys.readouterr().out.splitlines()
    problem = f"orphan registry {registry} is writable by others (mode 777): refusing to use it"
    assert said[1] == f"running:   no (it cannot use the registry: {problem})"
    assert said[2] == (
        "waiting:   its service is up: the guardian waits for it, guarding nothing, "
        f"{service_status.RECHECKS}"
    )
    assert said[-1] == f"-> {service_status.REGISTRY_FIX}"
    assert service.status(context, as_json=True) == 1
    assert json.loads(capsys.readouterr().out)["registry_problem"] == problem


def test_status_says_no_guardian_json_for_what_it_is(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry, _ = Registry.open(settings.registry_dir(ENVIRON), create=True)
    assert registry is not None
    state = guardian_home() / "guardian.json"
    assert service.status(context_for("systemd", FakeManager(home))) == 1
    said = capsys.readouterr().out.splitlines()
    assert said[1] == (
        f"running:   no (no {state}: none runs, and none has since "
        "it was made or the last one stopped)"
    )


def test_install_and_status_say_when_lingering_is_off(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home, linger=False)
    context = context_for("systemd", fake)
    assert service.install(context) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-2:] == [
        service_status.LINGER_OFF,
        "keep it running: sudo loginctl enable-linger $USER",
    ]
    assert service.install(context) == 0  # nothing to do, and still said
    assert capsys.readouterr().out.splitlines()[-2] == service_status.LINGER_OFF
    assert service.status(context) == 1
    said = capsys.readouterr().out.splitlines()
    assert said[1] == f"lingering: off: {service_status.LINGER_MEANS}"
    assert said[-1] == "-> sudo loginctl enable-linger $USER"
    assert service.status(context, as_json=True) == 1
    assert json.loads(capsys.readouterr().out)["linger"] is False


@pytest.mark.parametrize("linger", [True, None])
def test_lingering_on_or_unknown_is_not_mentioned(
    home: Path, linger: bool | None, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home, linger=linger)
    context = context_for("systemd", fake)
    assert service.install(context) == 0
    assert service.status(context) == 1
    said = capsys.readouterr().out
    assert "lingering is off" not in said and "enable-linger" not in said


def test_launchd_is_never_asked_about_lingering(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home, linger=False)
    context = context_for("launchd", fake)
    assert service.install(context) == 0
    assert service.status(context) == 1
    said = capsys.readouterr().out
    assert "lingering is off" not in said and "enable-linger" not in said
    assert not [call for call in fake.calls if call[0] == "loginctl"]
