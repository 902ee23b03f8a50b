"""`service install | uninstall | status`: the commands run through a fake launchctl
and systemctl with HOME redirected, and `status` against a real guardian process: alive
and holding its lock, then SIGKILLed. The files themselves: tests/test_service_files.py."""

from __future__ import annotations

import json
import os
import plistlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.endings import Ending
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.process_facts import Pid
from exo_orphan_guard.tools import cli, service, service_files
from exo_orphan_guard.tools.service_files import LABEL, UNIT_NAME, Manager
from tests.helpers.guardian import guardian_home, stand_in_guardian
from tests.helpers.service_fakes import (
    CLI,
    ENVIRON,
    PLIST,
    UID,
    UNIT,
    FakeManager,
    context_for,
    redirected_home,
    tree,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return redirected_home(tmp_path, monkeypatch)


def test_launchd_install_loads_once_and_again_only_what_changed(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home)
    target, plist = f"gui/{UID}/{LABEL}", str(home / PLIST)
    assert service.install(context_for("launchd", fake)) == 0
    load = [("launchctl", "enable", target), ("launchctl", "bootstrap", f"gui/{UID}", plist)]
    assert fake.changes == load and fake.loaded
    wanted = service_files.service_file("launchd", home, ENVIRON, CLI)
    assert (home / PLIST).read_text() == wanted.text
    assert (home / PLIST).stat().st_mode & 0o777 == 0o644
    assert (home / ".exo-test/orphan-guard").stat().st_mode & 0o777 == 0o700
    said = capsys.readouterr().out
    assert "EXO_HOME=.exo-test, EXO_ORPHAN_GUARD_GRACE=5" in said
    assert f"its log: {wanted.log}" in said

    written = (home / PLIST).stat().st_mtime_ns
    assert service.install(context_for("launchd", fake)) == 0
    assert fake.changes == load and (home / PLIST).stat().st_mtime_ns == written
    assert (
        capsys.readouterr().out
        == f"already installed and running: {home / PLIST} (nothing to do)\n"
    )

    changed = {**ENVIRON, "EXO_ORPHAN_GUARD_GRACE": "7"}
    assert service.install(context_for("launchd", fake, changed)) == 0
    assert fake.changes == [*load, ("launchctl", "bootout", target), *load]
    agent = plistlib.loads((home / PLIST).read_bytes())
    assert agent["EnvironmentVariables"]["EXO_ORPHAN_GUARD_GRACE"] == "7"


def test_launchd_without_a_gui_session_uses_the_user_domain(home: Path) -> None:
    fake = FakeManager(home, gui=False)
    assert service.install(context_for("launchd", fake)) == 0
    assert fake.changes[-1] == ("launchctl", "bootstrap", f"user/{UID}", str(home / PLIST))


@pytest.mark.parametrize("manager", ["launchd", "systemd"])
def test_uninstall_leaves_nothing_behind_and_is_idempotent(
    home: Path, manager: Manager, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(home)
    fake = FakeManager(home)
    assert service.install(context_for(manager, fake)) == 0
    if manager == "launchd":
        (home / ".exo-test/orphan-guard/guardian.log").write_text("what launchd kept\n")
    installed = len(fake.changes)
    assert service.uninstall(context_for(manager, fake)) == 0
    assert tree(home) == before
    assert not fake.loaded and not fake.enabled
    stop = (
        [("launchctl", "bootout", f"gui/{UID}/{LABEL}")]
        if manager == "launchd"
        else [
            ("systemctl", "--user", "disable", "--now", UNIT_NAME),
            ("systemctl", "--user", "daemon-reload"),
        ]
    )
    assert fake.changes[installed:] == stop
    capsys.readouterr()
    assert service.uninstall(context_for(manager, fake)) == 0
    assert fake.changes[installed:] == stop
    assert capsys.readouterr().out == "not installed: nothing to do\n"


def test_systemd_install_enables_starts_and_restarts_only_on_a_change(home: Path) -> None:
    fake = FakeManager(home)
    unit = ("systemctl", "--user")
    assert service.install(context_for("systemd", fake)) == 0
    first = [(*unit, "daemon-reload"), (*unit, "enable", "--now", UNIT_NAME)]
    assert fake.changes == first and fake.enabled and fake.loaded
    assert (home / UNIT).read_text() == service_files.service_file(
        "systemd", home, ENVIRON, CLI
    ).text

    assert service.install(context_for("systemd", fake)) == 0
    assert fake.changes == first

    changed = {**ENVIRON, "EXO_ORPHAN_GUARD_BUSY_WAIT": "60"}
    assert service.install(context_for("systemd", fake, changed)) == 0
    again = [(*unit, "daemon-reload"), (*unit, "enable", UNIT_NAME), (*unit, "restart", UNIT_NAME)]
    assert fake.changes == first + again

    fake.loaded = False  # stopped by hand: install starts it again, and no more
    assert service.install(context_for("systemd", fake, changed)) == 0
    assert fake.changes == [*first, *again, (*unit, "enable", "--now", UNIT_NAME)]


@pytest.mark.parametrize("manager", ["launchd", "systemd"])
def test_install_print_shows_the_file_and_commands_and_changes_nothing(
    home: Path, manager: Manager, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(home)
    fake = FakeManager(home)
    assert service.install(context_for(manager, fake), print_only=True) == 0
    assert fake.calls == [] and tree(home) == before
    wanted = service_files.service_file(manager, home, ENVIRON, CLI)
    commands = (
        [f"launchctl enable gui/{UID}/{LABEL}", f"launchctl bootstrap gui/{UID} {wanted.path}"]
        if manager == "launchd"
        else ["systemctl --user daemon-reload", f"systemctl --user enable --now {UNIT_NAME}"]
    )
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"# {wanted.path}"
    assert "\n".join(printed[1 : 1 + len(wanted.text.splitlines())]) + "\n" == wanted.text
    assert printed[-5:-2] == ["# then, where nothing is installed yet:", *commands]
    assert printed[-1] == "# (--print: nothing was written, and no command above was run)"


@pytest.mark.parametrize("manager", ["launchd", "systemd"])
def test_a_missing_launchctl_or_systemctl_is_one_line_and_changes_nothing(
    home: Path, manager: Manager, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(home)
    fake = FakeManager(home)
    context = context_for(manager, fake, which=lambda name: None)
    tool = "launchctl" if manager == "launchd" else "systemctl"
    assert service.install(context) == 1
    assert service.uninstall(context) == 0
    said = capsys.readouterr()
    assert said.out == "not installed: nothing to do\n"
    assert said.err == (
        f"exo-orphan-guard service install: {tool} is not on PATH; "
        "`service install --print` shows what it would do\n"
    )
    assert fake.calls == [] and tree(home) == before
    wanted = service_files.service_file(manager, home, ENVIRON, CLI)
    wanted.path.write_text(wanted.text)
    assert service.uninstall(context) == 1
    said = capsys.readouterr()
    assert said.err == f"exo-orphan-guard service uninstall: {tool} is not on PATH\n"
    assert said.out == "" and wanted.path.read_text() == wanted.text
    elsewhere = context_for(manager, fake, {}, which=lambda name: None)
    assert service.status(elsewhere) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"installed: yes, {wanted.path} (not asked: {tool} is not on PATH; "
        "not what `install` would write from here)"
    )


@pytest.mark.parametrize("answer", ["offline", "Failed to connect to bus: No medium found"])
def test_systemctl_without_a_user_session_is_one_line_and_changes_nothing(
    home: Path, answer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(home)
    fake = FakeManager(home, session=answer)
    assert service.install(context_for("systemd", fake)) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "exo-orphan-guard service install: systemctl --user has no user session here "
        f"(it answers {answer!r}): log in as this user, or start one at boot with "
        "`sudo loginctl enable-linger $USER`; `service install --print` shows what it would do"
    )
    assert fake.calls == [("systemctl", "--user", "is-system-running")]
    assert tree(home) == before


def test_a_command_that_fails_is_named_in_one_line(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home, fail="bootstrap")
    assert service.install(context_for("launchd", fake)) == 1
    said = capsys.readouterr()
    assert said.err == (
        "exo-orphan-guard service install: `launchctl bootstrap gui/501 "
        f"{home / PLIST}` failed (exit status 5): bootstrap failed: 5: Input/output error\n"
    )
    assert said.out == f"wrote {home / PLIST}\nran launchctl enable gui/501/{LABEL}\n"


def guardian_ending(pid: int, how: endings.How, step: endings.Step, by: endings.By) -> Ending:
    return Ending(
        "ended", Pid(pid), 1.0, system.boot_id(), time.time(), by, how, 0.5, "", step=step
    )


def test_status_exits_0_only_while_a_real_guardian_runs(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home)
    context = context_for("systemd", fake)
    registry, _ = Registry.open(settings.registry_dir(ENVIRON), create=True)
    assert registry is not None
    log = registry.path / endings.ENDINGS_NAME
    seen: list[tuple[int, endings.How, endings.Step, endings.By]] = [
        (1001, "clean", "interrupt", "guardian"),
        (1002, "killed", "grace", "guardian"),
        (1003, "clean", "worker_gone", "watchdog"),
    ]
    for pid, how, step, by in seen:
        assert endings.append(log, guardian_ending(pid, how, step, by))
    assert service.status(context) == 1
    assert "-> exo-orphan-guard service install" in capsys.readouterr().out

    assert service.install(context) == 0
    capsys.readouterr()
    with stand_in_guardian(guardian_home()) as guardian:
        assert service.status(context) == 0
        said = capsys.readouterr().out.splitlines()
        assert said[0] == f"installed: yes, {home / UNIT} (enabled, active)"
        assert said[1].startswith(f"running:   yes, pid {guardian.pid} since ")
        assert said[1].endswith(" (service mode, version 0.0.test)")
        assert said[2] == (
            "ended:     2 runner(s) since boot: 1 clean (interrupt 1), 1 killed (grace 1)"
        )
        assert service.status(context, as_json=True) == 0
        document = json.loads(capsys.readouterr().out)
        assert document["running"] is True and document["lock_held"] is True
        assert document["guardian"]["pid"] == guardian.pid
        assert document["ended"] == {
            "runners": 2,
            "clean": 1,
            "killed": 1,
            "steps": {"clean/interrupt": 1, "killed/grace": 1},
        }
    # SIGKILLed: its guardian.json stays behind and names a process that is gone.
    assert (guardian_home() / "guardian.json").is_file()
    assert service.status(context) == 1
    said = capsys.readouterr().out.splitlines()
    assert said[1] == (
        f"running:   no ({guardian_home() / 'guardian.json'} names pid {guardian.pid}, which is "
        "gone: it was killed, or it crashed)"
    )
    assert said[3] == f"-> its log: {service.JOURNAL}"


def test_the_cli_runs_the_guardian_with_its_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from exo_orphan_guard.guardian import service_run

    asked: list[tuple[str, bool, tuple[int, ...]]] = []

    def run(
        mode: str = "foreground", *, leave_when_idle: bool = False, watch: Sequence[int] = ()
    ) -> int:
        asked.append((mode, leave_when_idle, tuple(watch)))
        return 7

    monkeypatch.setattr(service_run, "run", run)
    worker = ["service", "run", "--mode", "worker", "--leave-when-idle", "--watch", "42"]
    assert cli.main(worker) == 7
    assert cli.main(["service", "run"]) == 7
    assert asked == [("worker", True, (42,)), ("foreground", False, ())]
    assert cli.main(["service", "run", "--mode", "daemon"]) == 2


def test_the_cli_prints_what_install_would_write_here(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = service_files.manager_for(sys.platform)
    if manager is None:
        pytest.skip(f"no launchd or systemd on {sys.platform}")
    assert cli.main(["service", "install", "--print"]) == 0
    path = service_files.file_path(manager, home, os.environ)
    assert capsys.readouterr().out.startswith(f"# {path}\n")
    assert not path.exists()
    assert cli.main(["service", "status", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["installed"] is False and document["running"] is False


@pytest.mark.parametrize(
    ("action", "codes"),
    [
        ("run", ["0 stopped", "2 the registry cannot be used", "--mode service it never exits"]),
        ("install", ["0 installed", "1 not done", "run as root", "2 a setting"]),
        ("uninstall", ["0 uninstalled", "1 not done"]),
        ("status", ["0 the guardian runs", "1 it does not"]),
    ],
)
def test_each_service_subcommand_says_its_exit_codes(
    action: str, codes: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["service", action, "--help"])
    assert exited.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "Exit codes:" in said
    for code in codes:
        assert code in said
