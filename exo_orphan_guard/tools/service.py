"""`exo-orphan-guard service install | uninstall | status`: the guardian (`service run`)
kept running by launchd (a LaunchAgent) or systemd (a user unit).

Both commands are idempotent: each asks the manager first and runs only what brings
the file and the job to where they should be; `uninstall` leaves no file of the
service behind (the registry, which the runners share, stays). Where the manager
cannot be asked (its tool missing, no user session) they say so in one line and
change nothing. Everything outside this process comes in through `Context`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from .. import system
from ..records import endings
from ..records.registry import Registry
from ..system import settings
from . import service_files, service_status
from .service_control import (
    Command,
    FileState,
    Plan,
    Run,
    Which,
    ask_job,
    fresh_install_plan,
    install_plan,
    run_command,
    run_commands,
    session_problem,
    uninstall_plan,
)
from .service_files import Manager, ServiceFile
from .service_status import StatusReport

EXIT_OK: Final = 0
EXIT_NOT_DONE: Final = 1
JOURNAL: Final = f"journalctl --user -u {service_files.UNIT_NAME}"


@final
@dataclass(frozen=True, slots=True)
class Context:
    manager: Manager | None
    platform: str
    home: Path
    uid: int
    environ: Mapping[str, str]
    cli: tuple[str, ...]
    """The CLI as the service starts it (`service_files.cli_words`)."""
    run: Run
    which: Which


def here() -> Context:
    return Context(
        manager=service_files.manager_for(sys.platform),
        platform=sys.platform,
        home=Path.home(),
        uid=os.getuid(),
        environ=dict(os.environ),
        cli=service_files.cli_words(
            sys.argv[0], sys.executable, shutil.which(service_files.CLI_NAME)
        ),
        run=run_command,
        which=shutil.which,
    )


def install(context: Context, *, print_only: bool = False) -> int:
    manager = context.manager
    if manager is None:
        return _cannot("install", _no_manager(context))
    wanted = service_files.service_file(manager, context.home, context.environ, context.cli)
    if print_only:
        print(_printed(wanted, fresh_install_plan(manager, context.uid, wanted.path), context))
        return EXIT_OK
    problem = session_problem(manager, context.run, context.which)
    if problem is not None:
        return _cannot("install", f"{problem}; `service install --print` shows what it would do")
    job = ask_job(manager, context.uid, context.run)
    plan = install_plan(manager, _file_state(wanted), job, wanted.path)
    if plan == Plan((), "keep", ()):
        print(f"already installed and running: {wanted.path} (nothing to do)")
        return EXIT_OK
    lines: list[str] = []
    failure = _carry_out(plan, wanted, context.run, lines)
    _say(lines)
    if failure:
        return _cannot("install", failure)
    print(_installed_lines(wanted, context))
    return EXIT_OK


def uninstall(context: Context) -> int:
    manager = context.manager
    if manager is None:
        return _cannot("uninstall", _no_manager(context))
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
    log = _installed_log(path) if manager == "launchd" and present else None
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
            _remove(leftover, lines)
        made = link.parent if manager == "systemd" else None if log is None else log.parent
        _remove_if_empty(made)
        failure = _run_all(plan.after, context.run, lines)
    _say(lines)
    if failure:
        return _cannot("uninstall", failure)
    print("uninstalled: the guardian is stopped and no file of its service is left")
    return EXIT_OK


def status(context: Context, *, as_json: bool = False) -> int:
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
    file_state: FileState = "absent" if wanted is None else _file_state(wanted)
    installed = None if wanted is None or file_state == "absent" else wanted.path
    job, problem, logs = None, None, None
    if manager is not None and installed is not None:
        problem = session_problem(manager, context.run, context.which)
        job = ask_job(manager, context.uid, context.run) if problem is None else None
        logs = JOURNAL if manager == "systemd" else str(_installed_log(installed))
    registry, _ = Registry.open(settings.registry_dir(context.environ), create=False)
    boot_id = system.boot_id()
    seen = [] if registry is None else endings.read(registry.path / endings.ENDINGS_NAME, boot_id)
    directory = None if registry is None else registry.path
    facts = service_status.read(manager, installed, directory, boot_id, seen)
    return StatusReport(facts, file_state, job, problem, logs)


def _carry_out(plan: Plan, wanted: ServiceFile, run: Run, lines: list[str]) -> str:
    failure = _run_all(plan.before, run, lines)
    if failure:
        return failure
    if plan.file == "write":
        _write(wanted)
        lines.append(f"wrote {wanted.path}")
    return _run_all(plan.after, run, lines)


def _run_all(commands: tuple[Command, ...], run: Run, lines: list[str]) -> str:
    return run_commands(commands, run, lambda command: lines.append(f"ran {shlex.join(command)}"))


def _write(wanted: ServiceFile) -> None:
    wanted.path.parent.mkdir(parents=True, exist_ok=True)
    if wanted.log is not None:
        # launchd opens the log but makes no directory for it.
        wanted.log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = wanted.path.with_name(f".{wanted.path.name}.{os.getpid()}.tmp")
    temporary.write_text(wanted.text)
    temporary.chmod(0o644)
    os.replace(temporary, wanted.path)


def _remove(path: Path, lines: list[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        lines.append(f"removed {path}")


def _remove_if_empty(directory: Path | None) -> None:
    # Made for the log (by `install`) or the link (by `enable`): kept while anything
    # else is in it.
    if directory is not None:
        with contextlib.suppress(OSError):
            directory.rmdir()


def _file_state(wanted: ServiceFile) -> FileState:
    try:
        text = wanted.path.read_text()
    except FileNotFoundError:
        return "absent"
    except (OSError, UnicodeDecodeError):
        return "different"
    return "same" if text == wanted.text else "different"


def _installed_log(path: Path) -> Path | None:
    try:
        return service_files.installed_log(path.read_text())
    except (OSError, UnicodeDecodeError):
        return None


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
            "# (--print: nothing was written or run)",
        ]
    )


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
