"""`exo-orphan-guard service install | uninstall | status`: the guardian (`service run`)
kept running by launchd (a LaunchAgent) or systemd (a user unit).

Both commands are idempotent: each asks the manager first and runs only what brings
the file and the job to where they should be; `uninstall` leaves no file of the
service behind (the registry, which the runners share, stays). Where the manager
cannot be asked (its tool missing, no user session) they say so in one line and
change nothing. Everything outside this process comes in through `Context`.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from .. import system
from ..exo import uv_project
from ..records import endings
from ..records.registry import Registry
from ..records.user_dir import user_dir
from ..system import settings
from . import service_checks, service_disk, service_files, service_status
from .service_control import (
    Command,
    Completed,
    FileState,
    Plan,
    Run,
    Which,
    ask_job,
    fresh_install_plan,
    install_plan,
    lingering,
    run_command,
    run_commands,
    session_problem,
    started_as_service,
    uninstall_plan,
)
from .service_files import Manager, ServiceFile
from .service_status import StatusReport

EXIT_OK: Final = 0
EXIT_NOT_DONE: Final = 1
EXIT_BAD_SETTING: Final = 2
JOURNAL: Final = f"journalctl --user -u {service_files.UNIT_NAME}"


@final
@dataclass(frozen=True, slots=True)
class Context:
    manager: Manager | None
    platform: str
    home: Path
    uid: int
    home_owner: int | None
    name_of: Callable[[int], str | None]
    """A uid's user name (None: unknown)."""
    environ: Mapping[str, str]
    cli: tuple[str, ...]
    """The CLI as the service starts it (`service_files.cli_words`)."""
    run: Run
    which: Which
    starts: Callable[[Command, Mapping[str, str]], Completed]
    """Runs a command as the service manager would (`started_as_service`)."""
    source: str
    """What to install the CLI from, for a line that says how."""


def here() -> Context:
    home = Path.home()
    return Context(
        manager=service_files.manager_for(sys.platform),
        platform=sys.platform,
        home=home,
        uid=os.getuid(),
        home_owner=_owner(home),
        name_of=_user_name,
        environ=dict(os.environ),
        cli=service_files.cli_words(
            sys.argv[0], sys.executable, shutil.which(service_files.CLI_NAME)
        ),
        run=run_command,
        which=shutil.which,
        starts=started_as_service,
        source=_source(),
    )


def install(context: Context, *, print_only: bool = False) -> int:
    manager = context.manager
    if manager is None:
        return _cannot("install", _no_manager(context))
    refused = _refusal(context, manager, "install")
    if refused is not None:
        return _cannot("install", refused)
    wanted = service_files.service_file(manager, context.home, context.environ, context.cli)
    bad = service_checks.setting_problems(wanted.environment, manager)
    if bad:
        for problem in bad:
            _cannot("install", problem)
        return EXIT_BAD_SETTING
    unusable = _unusable(context)
    if unusable is not None:
        return _cannot("install", unusable)
    if print_only:
        print(_printed(wanted, fresh_install_plan(manager, context.uid, wanted.path), context))
        return EXIT_OK
    problem = session_problem(manager, context.run, context.which)
    if problem is not None:
        return _cannot("install", f"{problem}; `service install --print` shows what it would do")
    job = ask_job(manager, context.uid, context.run)
    plan = install_plan(
        manager, service_disk.file_state(wanted.path, wanted.text), job, wanted.path
    )
    if plan == Plan((), "keep", ()):
        print(f"already installed and running: {wanted.path} (nothing to do)")
        _say(_linger_lines(context))
        return EXIT_OK
    lines: list[str] = []
    failure = _carry_out(plan, wanted, context.run, lines)
    _say(lines)
    if failure:
        return _cannot("install", failure)
    print(_installed_lines(wanted, context))
    _say(_linger_lines(context))
    return EXIT_OK


def _refusal(context: Context, manager: Manager, command: str) -> str | None:
    """Why `command` must not run here at all: as root for a user, or (install) from a
    CLI the service could not keep starting."""
    refused = service_checks.root_problem(
        manager,
        context.uid,
        context.home_owner,
        context.environ,
        context.name_of,
        context.cli,
        command,
    )
    if refused is not None or command != "install":
        return refused
    resolved = os.path.realpath(context.cli[0])
    stable = context.which(service_files.CLI_NAME)
    refused = service_checks.ephemeral_problem(context.cli, context.environ, resolved, stable)
    if refused is not None:
        return refused
    environment = {
        "PATH": os.defpath,
        "HOME": str(context.home),
        **dict(service_files.passed_environment(context.environ)),
    }
    started = context.starts((*context.cli, "--version"), environment)
    return service_checks.start_problem(context.cli, started, context.source)


def _unusable(context: Context) -> str | None:
    """Why the guardian could not use the registry this environment names (it would
    only wait for it). Read only: the guardian makes it."""
    registry, problem = Registry.open(settings.registry_dir(context.environ), create=False)
    if registry is None and problem is not None:
        return f"the guardian could not use its registry: {problem}; {service_status.REGISTRY_FIX}"
    return None


def uninstall(context: Context) -> int:
    manager = context.manager
    if manager is None:
        return _cannot("uninstall", _no_manager(context))
    refused = _refusal(context, manager, "uninstall")
    if refused is not None:
        return _cannot("uninstall", refused)
    path = service_files.file_path(manager, context.home, context.environ)
    present = path.is_file() or path.is_symlink()
    problem = session_problem(manager, context.run, context.which)
    if problem is not None and not present:
        print("not installed: nothing to do")
        return EXIT_OK
    if problem is not None:
        return _cannot("uninstall", problem)
    job = ask_job(manager, context.uid, context.run)
    plan = uninstall_plan(manager, present, job)
    log = service_disk.installed_log(path) if manager == "launchd" and present else None
    link = service_files.wants_link(path)
    leftovers = [
        *([path] if plan.file == "remove" else []),
        *([link] if manager == "systemd" and link.is_symlink() else []),
        *([log] if log is not None else []),
    ]
    if not plan.commands and not leftovers:
        print("not installed: nothing to do")
        return EXIT_OK
    lines: list[str] = []
    failure = _run_all(plan.before, context.run, lines)
    if not failure:
        for leftover in leftovers:
            service_disk.remove(leftover, lines)
        made = link.parent if manager == "systemd" else None if log is None else log.parent
        service_disk.remove_if_empty(made)
        failure = _run_all(plan.after, context.run, lines)
    _say(lines)
    if failure:
        return _cannot("uninstall", failure)
    print("uninstalled: the guardian is stopped and no file of its service is left")
    return EXIT_OK


def status(context: Context, *, as_json: bool = False) -> int:
    if context.manager is not None:
        # As root it would read the user's registry as root's, and refuse it.
        refused = _refusal(context, context.manager, "status")
        if refused is not None:
            return _cannot("status", refused)
    report = gather_status(context)
    print(service_status.to_json(report) if as_json else service_status.render(report))
    return report.exit_code


def gather_status(context: Context) -> StatusReport:
    manager = context.manager
    wanted = (
        None
        if manager is None
        else service_files.service_file(manager, context.home, context.environ, context.cli)
    )
    file_state: FileState = (
        "absent" if wanted is None else service_disk.file_state(wanted.path, wanted.text)
    )
    installed = None if wanted is None or file_state == "absent" else wanted.path
    job, problem, logs, linger = None, None, None, None
    if manager is not None and installed is not None:
        problem = session_problem(manager, context.run, context.which)
        job = ask_job(manager, context.uid, context.run) if problem is None else None
        logs = JOURNAL if manager == "systemd" else str(service_disk.installed_log(installed))
        if manager == "systemd" and problem is None:
            linger = lingering(context.uid, context.run, context.which)
    registry, unusable = Registry.open(settings.registry_dir(context.environ), create=False)
    # Not by `context.environ`: it is the user's, whatever the environment.
    home, home_problem = user_dir(create=False)
    boot_id = system.boot_id()
    seen = [] if registry is None else endings.read(registry.path / endings.ENDINGS_NAME, boot_id)
    facts = service_status.read(
        manager,
        installed,
        home,
        boot_id,
        seen,
        registry_problem=unusable or home_problem,
        linger=linger,
    )
    return StatusReport(facts, file_state, job, problem, logs)


def _carry_out(plan: Plan, wanted: ServiceFile, run: Run, lines: list[str]) -> str:
    failure = _run_all(plan.before, run, lines)
    if failure:
        return failure
    if plan.file == "write":
        # The process's own uid: root was refused, so it is the user's.
        made = (
            None
            if wanted.log is None
            else service_disk.make_log_directory(wanted.log.parent, os.geteuid())
        )
        failure = made or service_disk.write(wanted.path, wanted.text, os.geteuid())
        if failure:
            return failure
        lines.append(f"wrote {wanted.path}")
    return _run_all(plan.after, run, lines)


def _run_all(commands: tuple[Command, ...], run: Run, lines: list[str]) -> str:
    return run_commands(commands, run, lambda command: lines.append(f"ran {shlex.join(command)}"))


def _installed_lines(wanted: ServiceFile, context: Context) -> str:
    return "\n".join(
        [
            f"the guardian runs as: {shlex.join((*context.cli, *service_files.RUN_WORDS))}",
            _environment_line(wanted, context),
            f"its log: {wanted.log if wanted.log is not None else JOURNAL}",
            f"check it: {service_status.STATUS}",
        ]
    )


def _environment_line(wanted: ServiceFile, context: Context) -> str:
    passed = ", ".join(f"{name}={value}" for name, value in wanted.environment)
    if passed:
        return (
            f"its environment, written into {wanted.path.name} ({wanted.manager} does not "
            f"pass on this shell's or exo's; install again after changing them): {passed}"
        )
    return (
        "its environment: neither EXO_HOME nor any EXO_ORPHAN_GUARD_* setting is set here, "
        f"so it uses the defaults (registry {settings.registry_dir(context.environ)})"
    )


def _printed(wanted: ServiceFile, plan: Plan, context: Context) -> str:
    return "\n".join(
        [
            f"# {wanted.path}",
            wanted.text.rstrip("\n"),
            "# then, where nothing is installed yet:",
            *(shlex.join(command) for command in plan.commands),
            f"# {_environment_line(wanted, context)}",
            "# (--print: nothing was written, and no command above was run)",
        ]
    )


def _linger_lines(context: Context) -> list[str]:
    if context.manager != "systemd":
        return []
    if lingering(context.uid, context.run, context.which) is not False:
        return []
    return [
        f"{service_status.LINGER_OFF}",
        f"keep it running: {service_status.ENABLE_LINGER}",
    ]


def _owner(path: Path) -> int | None:
    try:
        return path.stat().st_uid
    except OSError:
        return None


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _source() -> str:
    """This checkout, when the package runs from one; else what it was installed from;
    else the package's name."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        return str(checkout)
    installed = uv_project.installed_from(uv_project.recorded_direct_url())
    return service_files.CLI_NAME if installed is None else str(installed)


def _no_manager(context: Context) -> str:
    return (
        f"no launchd or systemd on {context.platform}: run `exo-orphan-guard service run "
        "--mode service` under your own supervisor"
    )


def _say(lines: list[str]) -> None:
    if lines:
        print("\n".join(lines))


def _cannot(command: str, why: str) -> int:
    print(f"exo-orphan-guard service {command}: {why}", file=sys.stderr)
    return EXIT_NOT_DONE
