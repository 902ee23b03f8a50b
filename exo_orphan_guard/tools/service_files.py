"""What `service install` writes: a LaunchAgent (macOS) or a systemd user unit (Linux)
that keeps `exo-orphan-guard service run --mode service` running. Pure: the text and
the paths are functions of the CLI's path, the home directory and the environment.

launchd and systemd start the guardian with their own environment, never the shell's
nor exo's app's, so the settings the guardian reads (exo's home, the registry, the
grace, the busy wait, the scan interval, the backend) are written into the file as
they are when `install` runs (`service_checks` refuses values it would not take).
"""

from __future__ import annotations

import os
import plistlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast, final
from xml.parsers.expat import ExpatError

from ..system import settings

Manager = Literal["launchd", "systemd"]
LABEL: Final = "org.exo-orphan-guard.guardian"
"""The LaunchAgent's label (and its file's name, as launchd expects)."""
UNIT_NAME: Final = "exo-orphan-guard.service"
LOG_NAME: Final = "guardian.log"
CLI_NAME: Final = "exo-orphan-guard"
RUN_WORDS: Final = ("service", "run", "--mode", "service")
RESTART_SECONDS: Final = 5
"""systemd gives up on a unit restarted 5 times within 10 s; 5 s apart it never does,
so a guardian that keeps failing is retried for as long as the session lasts."""
GUARDIAN_SETTINGS: Final = (
    settings.EXO_HOME_ENV,
    settings.XDG_CACHE_ENV,
    settings.DIR_ENV,
    settings.GRACE_ENV,
    settings.BUSY_WAIT_ENV,
    settings.SCAN_INTERVAL_ENV,
    settings.BACKEND_ENV,
    settings.USER_DIR_ENV,
)
"""What the guardian reads: where exo keeps its cache (the registry and the hand-over
markers), the registry, its bounds, its backend, and its own directory if moved. Not
the toggle, the runners' strategy nor the CLI's ssh settings: the guardian reads none
of them."""
_PLAIN_WORD: Final = re.compile(r"[\w@%+=:,./-]+")


@final
@dataclass(frozen=True, slots=True)
class ServiceFile:
    manager: Manager
    path: Path
    text: str
    environment: tuple[tuple[str, str], ...]
    """What the file gives the guardian's environment, name and value."""
    log: Path | None
    """launchd only: where the guardian's output goes (systemd's journal keeps it)."""


def manager_for(platform: str) -> Manager | None:
    """The service manager `install` uses on `platform` (`sys.platform`), or None."""
    if platform == "darwin":
        return "launchd"
    if platform.startswith("linux"):
        return "systemd"
    return None


def file_path(manager: Manager, home: Path, environ: Mapping[str, str]) -> Path:
    if manager == "launchd":
        return home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    config = environ.get("XDG_CONFIG_HOME", "")
    # The XDG rule systemd's user manager follows: a relative value is ignored.
    base = Path(config) if os.path.isabs(config) else home / ".config"
    return base / "systemd" / "user" / UNIT_NAME


def wants_link(unit: Path) -> Path:
    """The link `systemctl --user enable` makes for `WantedBy=default.target`."""
    return unit.parent / "default.target.wants" / unit.name


def passed_environment(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The guardian's settings set here (`GUARDIAN_SETTINGS`), sorted by name."""
    return tuple((name, environ[name]) for name in sorted(environ) if name in GUARDIAN_SETTINGS)


def cli_words(argv0: str, executable: str, found: str | None) -> tuple[str, ...]:
    """The CLI as an absolute path (neither launchd nor systemd searches the user's
    PATH): the script this process was started as, else the one on PATH, else this
    interpreter with `-m` (`python -m exo_orphan_guard`, a checkout). Symlinks are
    kept: a pipx or Homebrew link outlives the upgrades that move its target."""
    if os.path.basename(argv0) == CLI_NAME:
        if os.sep in argv0:
            return (os.path.abspath(argv0),)
        if found is not None:
            return (os.path.abspath(found),)
    return (os.path.abspath(executable), "-m", "exo_orphan_guard")


def service_file(
    manager: Manager, home: Path, environ: Mapping[str, str], cli: tuple[str, ...]
) -> ServiceFile:
    environment = passed_environment(environ)
    path = file_path(manager, home, environ)
    if manager == "launchd":
        log = settings.registry_dir(environ) / LOG_NAME
        return ServiceFile(manager, path, launch_agent(cli, environment, log), environment, log)
    return ServiceFile(manager, path, user_unit(cli, environment), environment, None)


def launch_agent(cli: tuple[str, ...], environment: tuple[tuple[str, str], ...], log: Path) -> str:
    document: dict[str, object] = {
        "Label": LABEL,
        "ProgramArguments": [*cli, *RUN_WORDS],
        "RunAtLoad": True,
        "KeepAlive": True,
        # Without them launchd sends the guardian's output to /dev/null.
        "StandardOutPath": str(log),
        "StandardErrorPath": str(log),
    }
    if environment:
        document["EnvironmentVariables"] = dict(environment)
    return plistlib.dumps(document, sort_keys=True).decode()


def installed_log(text: str) -> Path | None:
    """Where an installed LaunchAgent sends its output (its own word: the environment
    may have changed since `install`)."""
    try:
        log = _plist_document(text).get("StandardOutPath")
    except ValueError:
        return None
    return Path(log) if isinstance(log, str) and os.path.isabs(log) else None


def user_unit(cli: tuple[str, ...], environment: tuple[tuple[str, str], ...]) -> str:
    lines = [
        "[Unit]",
        "Description=exo-orphan-guard guardian: ends the runners of exo processes that die",
        "",
        "[Service]",
        "ExecStart=" + _exec_line((*cli, *RUN_WORDS)),
        *(f"Environment={_quoted(f'{name}={value}')}" for name, value in environment),
        "Restart=always",
        f"RestartSec={RESTART_SECONDS}",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


def _exec_line(words: tuple[str, ...]) -> str:
    # systemd expands `%x` in every word, and `$NAME` in the arguments only (not in the
    # program's path, nor in Environment=).
    program, *arguments = words
    return " ".join([_exec_word(program), *(_exec_word(w.replace("$", "$$")) for w in arguments)])


def _exec_word(word: str) -> str:
    escaped = word.replace("%", "%%")
    return escaped if _PLAIN_WORD.fullmatch(word) else _quoted(escaped, specifiers=False)


def _quoted(text: str, *, specifiers: bool = True) -> str:
    escaped = text.replace("%", "%%") if specifiers else text
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _plist_document(text: str) -> dict[str, object]:
    try:
        document: object = plistlib.loads(text.encode())
    except (ValueError, ExpatError) as error:  # InvalidFileException is a ValueError
        raise ValueError(f"not a property list: {error}") from error
    if not isinstance(document, dict):
        raise ValueError("not a dictionary")
    return {str(key): value for key, value in cast(dict[object, object], document).items()}
