"""What `service install` refuses (and, as root, `uninstall` and `status`), decided by
pure functions, each reason one line that says what to run instead.

- **Root for another user.** A service is one user's: it guards that user's exo and
  runs that user's copy of the CLI. Installed as root into a user's home (macOS's
  sudo keeps `HOME`), it would be a root job running a program the user can change,
  at every login, and would leave root-owned files where the user's own guardian and
  exo must write. A system-wide daemon is no answer either: it would end every user's
  runners from one process, and need its own root-owned copy of the CLI. So root
  is refused unless the home is root's own, with the command that installs it as
  the user.
- **Settings the guardian would not take.** launchd and systemd keep what `install`
  writes; a value the guardian would warn about and replace at every start is refused
  here, once, instead.
- **An ephemeral CLI.** A path in a cache or temporary directory (uvx, `pipx run`) is
  deleted by its tool at some point, after which the service starts nothing; an
  uninstalled checkout (`python -m` from a source tree) does not start at all from
  where the manager starts it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Final

from ..system import settings
from .service_control import Completed
from .service_files import CLI_NAME, Manager

CACHE_PARTS: Final = frozenset({".cache", "Caches"})
"""A path component naming a cache: `~/.cache` (XDG, and pipx's `.cache` in its home),
`~/Library/Caches` (macOS)."""
TEMPORARY_ROOTS: Final = ("/tmp", "/private/tmp", "/var/folders", "/private/var/folders")
_RANGES: Final[Mapping[str, tuple[Callable[[str], str | None], str]]] = {
    settings.GRACE_ENV: (
        lambda raw: settings.parse_grace(raw).warning,
        f"0 or {settings.MIN_GRACE_SECONDS:g}..{settings.MAX_GRACE_SECONDS:g} seconds",
    ),
    settings.BUSY_WAIT_ENV: (
        lambda raw: settings.parse_busy_wait(raw).warning,
        f"0 or {settings.WEDGE_SECONDS:g}..{settings.MAX_BUSY_WAIT_SECONDS:g} seconds",
    ),
    settings.SCAN_INTERVAL_ENV: (
        lambda raw: settings.parse_scan_interval(raw).warning,
        f"{settings.MIN_SCAN_INTERVAL_SECONDS:g}..{settings.MAX_SCAN_INTERVAL_SECONDS:g} seconds",
    ),
    settings.BACKEND_ENV: (lambda raw: settings.parse_backend(raw).warning, "auto or portable"),
}
"""The guardian's settings with a range: what it warns about (its own parser's word)
and what it takes."""
_PATHS: Final = (settings.DIR_ENV, settings.XDG_CACHE_ENV, settings.USER_DIR_ENV)


def root_problem(
    manager: Manager,
    uid: int,
    home_owner: int | None,
    environ: Mapping[str, str],
    name_of: Callable[[int], str | None],
    cli: Sequence[str],
    command: str,
) -> str | None:
    """Why `service <command>` must not run as root here: the user it would act for
    (sudo's `SUDO_UID`, else the home's owner) is not root."""
    if uid != 0:
        return None
    sudo = environ.get("SUDO_UID", "")
    user = int(sudo) if sudo.isdigit() and int(sudo) != 0 else home_owner
    if user is None or user == 0:
        return None
    name = name_of(user)
    words = shlex.join((*cli, "service", command))
    who = name if name is not None else f"#{user}"
    if manager == "launchd":
        from_root = f"launchctl asuser {user} sudo -u {shlex.quote(who)} {words}"
    else:
        from_root = f"sudo -u {shlex.quote(who)} env XDG_RUNTIME_DIR=/run/user/{user} {words}"
    person = name if name is not None else f"uid {user}"
    why = (
        f"installed by root it would run a program {person} can change with root's rights, "
        f"and leave root-owned files in {person}'s home"
        if command == "install"
        else f"it is {person}'s, known to {person}'s {manager}, not root's"
    )
    return (
        f"refusing to run as root for {person}: the guardian's service is {person}'s own "
        f"({why}); run `{words}` as {person}, without sudo (from a root shell: `{from_root}`)"
    )


def setting_problems(environment: Sequence[tuple[str, str]], manager: Manager) -> list[str]:
    """One line per setting written into the service that the guardian would not take
    as it is."""
    problems: list[str] = []
    again = f"fix or unset it here, then install again ({manager} keeps what install writes)"
    for name, value in environment:
        if name in _RANGES:
            warning, accepted = _RANGES[name]
            if warning(value) is not None:
                problems.append(f"{name}={value!r}: must be {accepted}; {again}")
        elif name in _PATHS and value.strip() and not _absolute(name, value.strip()):
            problems.append(
                f"{name}={value!r}: must be an absolute path (the guardian starts in another "
                f"directory than this shell, where it would name another place); {again}"
            )
    return problems


def _absolute(name: str, value: str) -> bool:
    # The package's own settings take `~` (expanded with the guardian's HOME, the
    # same user's); exo takes XDG_CACHE_HOME as it is.
    tilde = name in (settings.DIR_ENV, settings.USER_DIR_ENV)
    return os.path.isabs(os.path.expanduser(value) if tilde else value)


def ephemeral_problem(
    cli: Sequence[str], environ: Mapping[str, str], resolved: str, stable: str | None
) -> str | None:
    """Why the CLI at `cli[0]` (whose target is `resolved`) is no path to keep in a
    service, naming the stable one: `stable` (the CLI on PATH) when it is one."""
    kind = _ephemeral_kind(cli[0], environ) or (
        _ephemeral_kind(resolved, environ) if len(cli) == 1 else None
    )
    if kind is None:
        return None
    where, tool, instead = kind
    if stable is not None and stable != cli[0] and _ephemeral_kind(stable, environ) is None:
        instead = f"run `{shlex.join((stable, 'service', 'install'))}` instead"
    return (
        f"{cli[0]} is in {where}, which {tool} may delete at any time (the service would "
        f"then start nothing): {instead}"
    )


def _ephemeral_kind(path: str, environ: Mapping[str, str]) -> tuple[str, str, str] | None:
    """Where `path` is, who deletes it, and how to get a stable one; None: stable."""
    parts = PurePosixPath(path).parts
    caches = [environ.get(name, "") for name in ("XDG_CACHE_HOME", "UV_CACHE_DIR")]
    in_cache = bool(CACHE_PARTS & set(parts)) or any(_under(path, cache) for cache in caches)
    uv = "uv" in parts or _under(path, environ.get("UV_CACHE_DIR", ""))
    if uv and (in_cache or "archive-v0" in parts):
        return (
            "uv's cache (uvx)",
            "uv",
            f"install it for good with `uv tool install <what you gave uvx>`, then run "
            f"`{CLI_NAME} service install`",
        )
    if "pipx" in parts and in_cache:
        return (
            "pipx's cache (`pipx run`)",
            "pipx",
            f"install it for good with `pipx install <what you gave pipx run>`, then run "
            f"`{CLI_NAME} service install`",
        )
    temporary = (environ.get("TMPDIR", ""), *TEMPORARY_ROOTS)
    if in_cache or any(_under(path, root) for root in temporary):
        return (
            "a cache or temporary directory",
            "the system or its owner",
            f"install it for good (`uv tool install <source>`), then run "
            f"`{CLI_NAME} service install`",
        )
    return None


def _under(path: str, directory: str) -> bool:
    if not os.path.isabs(directory):
        return False
    return PurePosixPath(path).is_relative_to(PurePosixPath(os.path.normpath(directory)))


def start_problem(cli: Sequence[str], started: Completed, source: str) -> str | None:
    """Why the CLI, started as launchd or systemd would start it (`started`: its
    `--version`, run from / without this shell's PYTHONPATH), is no CLI for the
    service: an uninstalled checkout, a package importable only from here."""
    if started.returncode == 0 and started.output.startswith(f"{CLI_NAME} "):
        return None
    lines = started.output.splitlines()
    said = lines[-1] if lines else f"exit status {started.returncode}"
    return (
        f"`{shlex.join((*cli, '--version'))}` fails when started from / as the service "
        f"would start it ({said}): install it first (`uv tool install {source}`), then run "
        f"`{CLI_NAME} service install`"
    )
