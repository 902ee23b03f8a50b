"""What `service install` refuses, with one line saying what to run instead, and
nothing written or run: root acting for a user (injected: the tests' own uid does not
matter); and how it writes its file: only into a directory it checked, never through a
link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exo_orphan_guard.tools import service, service_checks
from exo_orphan_guard.tools.service_files import LABEL, Manager
from tests.helpers.service_fakes import (
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


def refused(
    capsys: pytest.CaptureFixture[str], command: str = "install"
) -> str:  # the one line said, checked to be one
    said = capsys.readouterr()
    (line,) = said.err.splitlines()
    assert said.out == ""
    prefix = f"exo-orphan-guard service {command}: "
    assert line.startswith(prefix)
    return line.removeprefix(prefix)


@pytest.mark.parametrize("manager", ["launchd", "systemd"])
def test_root_for_a_users_home_is_refused_with_what_to_run(
    home: Path, manager: Manager, capsys: pytest.CaptureFixture[str]
) -> None:
    """macOS's sudo keeps HOME: as root, `install` would make a root job of the user's
    guardian and root-owned files in the user's home."""
    before = tree(home)
    fake = FakeManager(home)
    as_root = context_for(manager, fake, uid=0)
    for print_only in (False, True):
        assert service.install(as_root, print_only=print_only) == 1
        line = refused(capsys)
        assert line.startswith("refusing to run as root for ada: ")
        assert "run `/opt/exo/bin/exo-orphan-guard service install` as ada, without sudo" in line
        from_root = (
            f"launchctl asuser {UID} sudo -u ada /opt/exo/bin/exo-orphan-guard service install"
            if manager == "launchd"
            else f"sudo -u ada env XDG_RUNTIME_DIR=/run/user/{UID} "
            "/opt/exo/bin/exo-orphan-guard service install"
        )
        assert line.endswith(f"(from a root shell: `{from_root}`)")
    for command in ("uninstall", "status"):
        assert getattr(service, command)(as_root) == 1
        line = refused(capsys, command)
        assert f"run `/opt/exo/bin/exo-orphan-guard service {command}` as ada" in line
    assert fake.calls == [] and tree(home) == before


def test_sudo_names_the_user_even_where_it_resets_home(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home)
    sudo = {**ENVIRON, "SUDO_UID": str(UID), "SUDO_USER": "ada"}
    assert service.install(context_for("systemd", fake, sudo, uid=0, home_owner=0)) == 1
    assert refused(capsys).startswith("refusing to run as root for ada: ")
    assert fake.calls == []


def test_root_in_its_own_home_installs_its_own() -> None:
    words = ("/usr/local/bin/exo-orphan-guard",)
    for owner, environ in ((0, {}), (0, {"SUDO_UID": "0"}), (UID, {})):
        uid = 0 if owner == 0 else UID
        assert service_checks.root_problem("launchd", uid, owner, environ, str, words, "x") is None


def test_a_directory_others_can_write_gets_no_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agents = home / "Library/LaunchAgents"
    agents.chmod(0o777)
    fake = FakeManager(home)
    assert service.install(context_for("launchd", fake)) == 1
    assert refused(capsys) == (
        f"{agents} is writable by others (mode 777): refusing to write {LABEL}.plist into it"
    )
    assert os.listdir(agents) == [] and fake.changes == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_a_directory_of_another_owner_gets_no_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agents = home / "Library/LaunchAgents"
    os.chown(agents, 12345, 12345)
    fake = FakeManager(home)
    assert service.install(context_for("launchd", fake)) == 1
    assert refused(capsys) == (
        f"{agents} is owned by uid 12345, not 0: refusing to write {LABEL}.plist into it"
    )
    assert os.listdir(agents) == [] and fake.changes == []


def test_a_link_at_the_temporary_name_is_never_written_through(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The temporary file's name made predictable, and a link planted there (and at the
    name earlier releases used): the file is created new (O_EXCL|O_NOFOLLOW) or not at
    all."""
    monkeypatch.setattr("exo_orphan_guard.tools.service_disk.time.monotonic_ns", lambda: 7)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    agents = home / "Library/LaunchAgents"
    for name in (f".{LABEL}.plist.{os.getpid()}.7.tmp", f".{LABEL}.plist.{os.getpid()}.tmp"):
        (agents / name).symlink_to(victim)
    fake = FakeManager(home)
    assert service.install(context_for("launchd", fake)) == 1
    assert refused(capsys) == f"cannot write {home / PLIST} (File exists)"
    assert victim.read_text() == "untouched\n"
    assert not (home / PLIST).exists() and fake.changes == []


def test_a_link_at_the_files_own_name_is_replaced_not_followed(home: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (home / UNIT).symlink_to(victim)
    assert service.install(context_for("systemd", FakeManager(home))) == 0
    assert victim.read_text() == "untouched\n"
    assert not (home / UNIT).is_symlink() and "ExecStart=" in (home / UNIT).read_text()


def test_directories_it_makes_are_the_users_and_no_one_elses(home: Path) -> None:
    (home / "Library/LaunchAgents").rmdir()
    (home / "Library").rmdir()
    old = os.umask(0o002)  # a user-private-group umask: new directories group-writable
    try:
        assert service.install(context_for("launchd", FakeManager(home))) == 0
    finally:
        os.umask(old)
    for made in ("Library", "Library/LaunchAgents"):
        assert (home / made).stat().st_mode & 0o777 == 0o755
    assert (home / ".exo-test/orphan-guard").stat().st_mode & 0o777 == 0o700
    assert (home / PLIST).stat().st_mode & 0o777 == 0o644
