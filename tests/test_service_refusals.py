"""What `service install` refuses, each with one line saying what to run instead, and
nothing written or run: root acting for a user (injected: the tests' own uid does not
matter), settings the guardian would not take, a CLI in a cache or one that does not
start from / (a real interpreter without the package), a registry the guardian could
not use; and how it writes its file: only into a directory it checked, never through a
link."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from exo_orphan_guard.tools import service, service_checks
from exo_orphan_guard.tools.service_control import Command, Completed, started_as_service
from exo_orphan_guard.tools.service_files import LABEL, Manager
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


@pytest.mark.parametrize(
    ("path", "where"),
    [
        ("/Users/ada/.cache/uv/archive-v0/Xa1/bin/exo-orphan-guard", "uv's cache (uvx)"),
        ("/home/ada/.cache/uv/archive-v0/Xa1/bin/exo-orphan-guard", "uv's cache (uvx)"),
        ("/srv/uvcache/archive-v0/Xa1/bin/exo-orphan-guard", "uv's cache (uvx)"),
        ("/home/ada/.local/pipx/.cache/0c1/bin/exo-orphan-guard", "pipx's cache (`pipx run`)"),
        ("/Users/ada/Library/Caches/pipx/0c1/bin/exo-orphan-guard", "pipx's cache (`pipx run`)"),
        ("/home/ada/.cache/pipx/0c1/bin/exo-orphan-guard", "pipx's cache (`pipx run`)"),
        ("/private/var/folders/x/T/venv/bin/exo-orphan-guard", "a cache or temporary directory"),
        ("/tmp/venv/bin/exo-orphan-guard", "a cache or temporary directory"),
    ],
)
def test_a_cli_in_a_cache_or_temporary_directory_is_refused(path: str, where: str) -> None:
    environ = {"UV_CACHE_DIR": "/srv/uvcache"}
    line = service_checks.ephemeral_problem((path,), environ, path, None)
    assert line is not None and line.startswith(f"{path} is in {where}, which ")
    assert line.endswith("then run `exo-orphan-guard service install`")
    stable = "/home/ada/.local/bin/exo-orphan-guard"
    named = service_checks.ephemeral_problem((path,), environ, path, stable)
    assert named is not None
    assert named.endswith(f": run `{stable} service install` instead")


@pytest.mark.parametrize(
    "path",
    [
        "/home/ada/.local/bin/exo-orphan-guard",
        "/home/ada/.local/share/uv/tools/exo-orphan-guard/bin/exo-orphan-guard",
        "/opt/homebrew/bin/exo-orphan-guard",
        "/Users/ada/.local/pipx/venvs/exo-orphan-guard/bin/exo-orphan-guard",
        "/Users/ada/src/exo-orphan-guard/.venv/bin/exo-orphan-guard",
    ],
)
def test_an_installed_cli_is_kept(path: str) -> None:
    assert service_checks.ephemeral_problem((path,), {}, path, None) is None


def test_a_link_into_a_cache_is_as_ephemeral_as_its_target() -> None:
    link, target = "/home/ada/bin/exo-orphan-guard", "/home/ada/.cache/uv/archive-v0/X/bin/e"
    assert service_checks.ephemeral_problem((link,), {}, target, None) is not None
    # A venv's python resolves to its base interpreter: only the venv's path counts.
    python = (link, "-m", "exo_orphan_guard")
    assert service_checks.ephemeral_problem(python, {}, target, None) is None


def test_install_from_uvx_changes_nothing_and_names_the_stable_cli(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(home)
    fake = FakeManager(home)
    uvx = (str(home / ".cache/uv/archive-v0/Xa1/bin/exo-orphan-guard"),)
    context = context_for("launchd", fake, cli=uvx)
    assert service.install(context) == 1
    assert refused(capsys).endswith(": run `/usr/bin/exo-orphan-guard service install` instead")
    assert fake.calls == [] and tree(home) == before


def test_an_uninstalled_checkout_is_refused_as_the_service_would_start_it(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real interpreter without the package: from the checkout `python -m` finds it
    (the current directory), from / (as launchd and systemd start it) it does not."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", bare], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    checkout = Path(__file__).resolve().parents[1]
    here = subprocess.run(
        [python, "-c", "import exo_orphan_guard"], cwd=checkout, check=False, timeout=60
    )
    assert here.returncode == 0
    # Named as a checkout's venv would be (a path under /tmp is refused before any
    # start); started, the bare interpreter.
    cli = ("/home/ada/src/exo-orphan-guard/venv/bin/python", "-m", "exo_orphan_guard")

    def starts(command: Command, environment: Mapping[str, str]) -> Completed:
        return started_as_service((python, *command[1:]), environment)

    fake = FakeManager(home)
    context = context_for("systemd", fake, cli=cli, starts=starts)
    assert service.install(context) == 1
    line = refused(capsys)
    assert line.startswith(f"`{shlex.join(cli)} --version` fails when started from /")
    assert "No module named exo_orphan_guard" in line
    assert line.endswith(
        "install it first (`uv tool install /src/exo-orphan-guard`), then run "
        "`exo-orphan-guard service install`"
    )
    assert fake.calls == [] and not (home / UNIT).exists()
    # The tests' own interpreter has it installed: from / it starts.
    ours = (sys.executable, "-m", "exo_orphan_guard", "--version")
    started = started_as_service(ours, {"PATH": os.defpath, "HOME": str(home)})
    assert service_checks.start_problem(ours[:3], started, "x") is None, started


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("EXO_ORPHAN_GUARD_BUSY_WAIT", "abc", "0 or 0.5..900 seconds"),
        ("EXO_ORPHAN_GUARD_GRACE", "0.1", "0 or 0.5..120 seconds"),
        ("EXO_ORPHAN_GUARD_SCAN_INTERVAL", "0", "0.1..600 seconds"),
        ("EXO_ORPHAN_GUARD_BACKEND", "kqueue", "auto or portable"),
    ],
)
@pytest.mark.parametrize("print_only", [False, True])
def test_a_setting_the_guardian_would_not_take_is_refused(
    home: Path,
    name: str,
    value: str,
    accepted: str,
    print_only: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = tree(home)
    fake = FakeManager(home)
    context = context_for("systemd", fake, {**ENVIRON, name: value})
    assert service.install(context, print_only=print_only) == 2
    assert refused(capsys) == (
        f"{name}={value!r}: must be {accepted}; fix or unset it here, then install again "
        "(systemd keeps what install writes)"
    )
    assert fake.calls == [] and tree(home) == before


def test_relative_paths_are_refused_each_on_its_line(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeManager(home)
    environ = {**ENVIRON, "EXO_ORPHAN_GUARD_DIR": "guard", "XDG_CACHE_HOME": "cache"}
    assert service.install(context_for("systemd", fake, environ), print_only=True) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": must be an absolute path")[0] for line in lines] == [
        "exo-orphan-guard service install: EXO_ORPHAN_GUARD_DIR='guard'",
        "exo-orphan-guard service install: XDG_CACHE_HOME='cache'",
    ]
    home_relative = {**ENVIRON, "EXO_ORPHAN_GUARD_DIR": "~/guard", "EXO_ORPHAN_GUARD": "maybe"}
    assert service.install(context_for("systemd", fake, home_relative), print_only=True) == 0
    printed = capsys.readouterr().out
    assert 'Environment="EXO_ORPHAN_GUARD_DIR=~/guard"' in printed
    assert "EXO_ORPHAN_GUARD=maybe" not in printed


@pytest.mark.parametrize("manager", ["launchd", "systemd"])
def test_a_registry_the_guardian_could_not_use_is_refused(
    home: Path, manager: Manager, capsys: pytest.CaptureFixture[str]
) -> None:
    """exFAT and SMB show every directory as mode 777: the guardian would wait for
    ever, guarding nothing."""
    registry = home / ".exo-test/orphan-guard"
    registry.mkdir()
    registry.chmod(0o777)
    before = tree(home)
    fake = FakeManager(home)
    assert service.install(context_for(manager, fake)) == 1
    assert refused(capsys) == (
        f"the guardian could not use its registry: orphan registry {registry} is writable "
        "by others (mode 777): refusing to use it; fix the registry's owner and mode "
        "(yours, 700), or set EXO_ORPHAN_GUARD_DIR to a directory of your own and install "
        "again"
    )
    assert fake.calls == [] and tree(home) == before


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


def test_a_stand_in_probe_that_fails_is_named_by_its_last_line() -> None:
    started = Completed(1, "Traceback (most recent call last):\n...\nImportError: no psutil")
    line = service_checks.start_problem(CLI, started, "exo-orphan-guard")
    assert line is not None and "(ImportError: no psutil)" in line
