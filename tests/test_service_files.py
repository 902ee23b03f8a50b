"""`service install`'s files, from pure functions: the plist parsed back, the unit
checked word by word and verified by systemd-analyze where it is here, the environment
and the CLI path they carry."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.tools import service_files
from exo_orphan_guard.tools.service_files import LABEL, UNIT_NAME
from tests.helpers.service_fakes import CLI, ENVIRON, PLIST, UNIT, redirected_home


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return redirected_home(tmp_path, monkeypatch)


def test_the_launch_agent_keeps_the_guardian_running_with_its_settings(home: Path) -> None:
    wanted = service_files.service_file("launchd", home, ENVIRON, CLI)
    log = home / ".exo-test/orphan-guard/guardian.log"
    assert wanted.path == home / PLIST and wanted.log == log
    assert plistlib.loads(wanted.text.encode()) == {
        "Label": LABEL,
        "ProgramArguments": [*CLI, "service", "run", "--mode", "service"],
        "RunAtLoad": True,
        "KeepAlive": True,
        "StandardOutPath": str(log),
        "StandardErrorPath": str(log),
        "EnvironmentVariables": {"EXO_HOME": ".exo-test", "EXO_ORPHAN_GUARD_GRACE": "5"},
    }
    assert service_files.installed_log(wanted.text) == log
    assert service_files.installed_log("not a plist") is None


def test_the_user_unit_restarts_the_guardian_always(home: Path) -> None:
    wanted = service_files.service_file("systemd", home, ENVIRON, CLI)
    assert wanted.path == home / UNIT and wanted.log is None
    assert wanted.text == (
        "[Unit]\n"
        "Description=exo-orphan-guard guardian: ends the runners of exo processes that die\n"
        "\n"
        "[Service]\n"
        "ExecStart=/opt/exo/bin/exo-orphan-guard service run --mode service\n"
        'Environment="EXO_HOME=.exo-test"\n'
        'Environment="EXO_ORPHAN_GUARD_GRACE=5"\n'
        "Restart=always\n"
        "RestartSec=5\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )
    config = {"XDG_CONFIG_HOME": "/etc/xdg-alt"}
    assert service_files.file_path("systemd", home, config) == Path(
        f"/etc/xdg-alt/systemd/user/{UNIT_NAME}"
    )
    assert service_files.file_path("systemd", home, {"XDG_CONFIG_HOME": "rel"}) == home / UNIT


def test_unit_words_are_escaped_as_systemd_reads_them(home: Path) -> None:
    environ = {"EXO_HOME": 'a "b" $x 100%\\'}
    text = service_files.user_unit(("/opt/my apps/50%/exo-orphan-guard",), tuple(environ.items()))
    assert 'ExecStart="/opt/my apps/50%%/exo-orphan-guard" service run --mode service\n' in text
    assert 'Environment="EXO_HOME=a \\"b\\" $x 100%%\\\\"\n' in text
    unit = service_files.user_unit(("/venv $HOME/python", "-m", "$x"), ())
    assert 'ExecStart="/venv $HOME/python" -m "$$x" service run --mode service\n' in unit


def test_the_environment_passed_is_what_the_guardian_reads() -> None:
    """exo's directories and the guardian's own settings; not the toggle, the runners'
    strategy, the CLI's ssh settings, nor what the guard sets in one worker's runners
    (`EXO_ORPHAN_GUARD=maybe` in the shell is no business of the service's)."""
    environ = {
        **ENVIRON,
        "EXO_ORPHAN_GUARD": "maybe",
        "EXO_ORPHAN_GUARD_RUNNER": "9:1.0",
        "EXO_ORPHAN_GUARDIAN": "not ours",
        "EXO_ORPHAN_GUARD_STRATEGY": "pidfd",
        "EXO_ORPHAN_GUARD_SSH_COMMAND": "ssh -q",
        "EXO_ORPHAN_GUARD_BUSY_WAIT": "300",
        "EXO_ORPHAN_GUARD_SCAN_INTERVAL": "5",
        "EXO_ORPHAN_GUARD_BACKEND": "portable",
        "EXO_ORPHAN_GUARD_DIR": "/r",
        "XDG_CACHE_HOME": "/c",
        "XDG_CONFIG_HOME": "/not-exos-cache",
    }
    assert service_files.passed_environment(environ) == (
        ("EXO_HOME", ".exo-test"),
        ("EXO_ORPHAN_GUARD_BACKEND", "portable"),
        ("EXO_ORPHAN_GUARD_BUSY_WAIT", "300"),
        ("EXO_ORPHAN_GUARD_DIR", "/r"),
        ("EXO_ORPHAN_GUARD_GRACE", "5"),
        ("EXO_ORPHAN_GUARD_SCAN_INTERVAL", "5"),
        ("XDG_CACHE_HOME", "/c"),  # where exo keeps its cache on Linux: the markers
    )


def test_the_cli_is_named_by_an_absolute_path() -> None:
    words = service_files.cli_words
    assert words("/usr/local/bin/exo-orphan-guard", "/py", None) == (
        "/usr/local/bin/exo-orphan-guard",
    )
    assert words("exo-orphan-guard", "/py", "/home/u/.local/bin/exo-orphan-guard") == (
        "/home/u/.local/bin/exo-orphan-guard",
    )
    assert words(
        "/src/exo_orphan_guard/__main__.py", "/venv/bin/python", "/x/exo-orphan-guard"
    ) == (
        "/venv/bin/python",
        "-m",
        "exo_orphan_guard",
    )
    assert words("exo-orphan-guard", "/venv/bin/python", None)[1:] == ("-m", "exo_orphan_guard")


def test_systemd_takes_the_unit_and_its_command_runs(home: Path, tmp_path: Path) -> None:
    """The unit as systemd parses it, with a CLI path that needs quoting and escaping;
    then the command it starts, asked for its help (the guardian itself is not run)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not on PATH: no systemd to check the unit against")
    cli_path = tmp_path / "my $apps 100%" / "exo-orphan-guard"
    cli_path.parent.mkdir()
    cli_path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m exo_orphan_guard "$@"\n')
    cli_path.chmod(0o755)
    wanted = service_files.service_file("systemd", home, ENVIRON, (str(cli_path),))
    wanted.path.write_text(wanted.text)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    environment = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "HOME": str(home)}
    verified = subprocess.run(
        [analyze, "--user", "verify", str(wanted.path)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    said = (verified.stdout + verified.stderr).strip()
    if "Failed to initialize manager" in said:
        pytest.skip(f"systemd-analyze cannot start a user manager here: {said}")
    assert (verified.returncode, said) == (0, "")
    helped = subprocess.run(
        [str(cli_path), *service_files.RUN_WORDS, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert helped.returncode == 0 and "--leave-when-idle" in helped.stdout
