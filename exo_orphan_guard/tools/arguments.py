"""`exo-orphan-guard`'s grammar: one small function per subcommand adds its arguments.

Argument errors raise `UsageError` (the CLI's exit code 2) instead of argparse's exit.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, NoReturn, final

from .._version import __version__
from ..records.guardian_state import MODES
from ..system import settings


class UsageError(Exception):
    """Bad arguments or configuration: exit code 2."""


@final
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="exo-orphan-guard",
        description="Find and kill exo runners that outlived their worker.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, summary, description, add_arguments in _COMMANDS:
        add_arguments(commands.add_parser(name, help=summary, description=description))
    return parser


def _scan_arguments(command: argparse.ArgumentParser) -> None:
    _judging_arguments(command)
    command.add_argument("--all", action="store_true", help="also show what was spared, and why")


def _sweep_arguments(command: argparse.ArgumentParser) -> None:
    _judging_arguments(command)
    command.add_argument(
        "--dry-run", action="store_true", help="show what would be killed; kill nothing"
    )
    _grace_argument(
        command,
        "SIGTERM",
        "; with --now, 0. An exo runner gets SIGINT instead, and "
        f"${settings.BUSY_WAIT_ENV} (default {settings.DEFAULT_BUSY_WAIT_SECONDS:g} s, never "
        "less than the grace; with --now, the grace) before SIGKILL",
    )
    command.add_argument(
        "--now",
        action="store_true",
        help="kill at once: do not wait for runners already ending the clean way or busy "
        "in native code (on macOS a hard kill can strand wired memory until a reboot)",
    )


def _judging_arguments(command: argparse.ArgumentParser) -> None:
    """What `scan` and `sweep` share: where the records are and what to look for."""
    command.add_argument("--json", action="store_true", help="machine-readable report")
    command.add_argument(
        "--dir",
        type=Path,
        help=f"registry directory (default: ${settings.DIR_ENV}, else {_default_registry()})",
    )
    command.add_argument(
        "--registry-only",
        action="store_true",
        help="only recorded runners: skip the process-table fingerprint scan",
    )
    command.add_argument(
        "--match",
        metavar="REGEX",
        help="also target processes whose command line matches REGEX (mlx.launch ranks) "
        "once reparented to pid 1",
    )
    command.add_argument(
        "--any-parent",
        action="store_true",
        help="with --match: whatever their parent (ranks under a stuck sshd)",
    )
    command.add_argument(
        "--all-users",
        action="store_true",
        help="root only: also other users' processes (never the default)",
    )
    _add_host_arguments(command)


def _default_registry() -> str:
    """Where the registry is here without `EXO_ORPHAN_GUARD_DIR`: exo's cache directory
    on this OS (`~/.exo` on macOS, `~/.cache/exo` on Linux, `~/$EXO_HOME` when set)."""
    unset = {name: value for name, value in os.environ.items() if name != settings.DIR_ENV}
    path = str(settings.registry_dir(unset))
    home = str(Path.home())
    return "~" + path[len(home) :] if path.startswith(home + os.sep) else path


def _patch_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("action", choices=("check", "apply", "revert", "export"))
    command.add_argument("--exo", type=Path, required=True, metavar="PATH", help="exo checkout")
    command.add_argument(
        "--source",
        type=Path,
        metavar="SRC",
        help="apply: a wheel, sdist or checkout of exo-orphan-guard for exo's "
        "[tool.uv.sources], so the orphan-guard extra resolves without an index",
    )
    command.add_argument(
        "--no-lock", action="store_true", help="apply: do not run `uv lock` in the exo tree"
    )
    command.add_argument(
        "--with-package",
        action="store_true",
        help="apply, export: also the local series, the package's part inside exo (apply "
        "adds it by itself with --source or the package in the tree's .venv)",
    )
    command.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="export: where the series goes (default: ./orphan-guard-<series>)",
    )
    command.add_argument(
        "--bugfix",
        action="store_true",
        help="export: the bugfix series for exo's own stop instead "
        "(default: ./exo-bugfix-<series>)",
    )


def _explain_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("text", nargs="+", help="e.g. 'RTR failed with errno 16' or 96")
    command.add_argument("--json", action="store_true")


def _doctor_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--exo", type=Path, metavar="PATH", help="exo checkout to check")
    command.add_argument("--json", action="store_true")
    _add_host_arguments(command)


def _exec_arguments(command: argparse.ArgumentParser) -> None:
    _grace_argument(command, "the forwarded signal")
    command.add_argument(
        "--stdin-hup",
        action="store_true",
        help="also stop CMD when stdin reaches EOF or hangs up (CMD then gets /dev/null)",
    )
    command.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...", help="the command to run"
    )


def _selftest_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--strategy",
        action="append",
        choices=settings.STRATEGIES,
        help="only this strategy (repeatable); default: every one this OS offers",
    )
    command.add_argument("--json", action="store_true", help="one JSON object, for a bug report")


def _service_arguments(command: argparse.ArgumentParser) -> None:
    actions = command.add_subparsers(dest="action", required=True, parser_class=_Parser)
    run = actions.add_parser(
        "run",
        help="the guardian itself, until stopped",
        description="End the runners of every exo process of this user that dies, from "
        "outside exo, until stopped. One per user per machine: a second waits for the "
        "first to let go. Exit codes: 0 stopped (SIGTERM, SIGINT, SIGHUP), left when idle "
        "(--leave-when-idle), or left to another guardian (--mode worker); 2 the registry "
        "cannot be used (one line says why). With --mode service it never exits for that: "
        "it says why once and waits for the registry, re-checking, since launchd and "
        "systemd would restart it forever (`service status` shows it waiting).",
    )
    run.add_argument(
        "--mode",
        choices=MODES,
        default="foreground",
        help="who started it: launchd or systemd (service), exo's worker (worker), or by "
        "hand (foreground, the default)",
    )
    run.add_argument(
        "--leave-when-idle",
        action="store_true",
        help="exit once no exo process of this user is left",
    )
    run.add_argument(
        "--watch",
        metavar="PID",
        type=int,
        action="append",
        default=[],
        help="also watch this exo process before it has runners (exo's worker passes "
        "its own pid; repeatable)",
    )
    install = actions.add_parser(
        "install",
        help="have launchd (macOS) or systemd (Linux) keep the guardian running",
        description="Write a LaunchAgent (~/Library/LaunchAgents) or a systemd user unit "
        "(~/.config/systemd/user) that runs `service run --mode service`, with the "
        "guardian's settings set here (EXO_HOME, XDG_CACHE_HOME, EXO_ORPHAN_GUARD_DIR, "
        "_GRACE, _BUSY_WAIT, _SCAN_INTERVAL, _BACKEND) written into it, then load and start "
        "it; on Linux, say if systemd lingering is off (the guardian then stops at your "
        "last logout). Run it as the user it guards, never with sudo. Exit codes: 0 "
        "installed and running (or already); 1 not done, one line says why: run as root "
        "for a user, a CLI in a cache (uvx, pipx run) or one that does not start from / "
        "(an uninstalled checkout), a registry the guardian could not use, no launchctl or "
        "systemctl, no user session, a command that failed; 2 a setting the guardian would "
        "not take (one line each).",
    )
    install.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the file and the commands; change nothing",
    )
    actions.add_parser(
        "uninstall",
        help="stop the guardian's service and remove its file",
        description="Exit codes: 0 uninstalled (or nothing installed), 1 not done (one "
        "line says why: run as root for a user, no launchctl or systemctl, a command that "
        "failed).",
    )
    status = actions.add_parser(
        "status",
        help="installed or not, running or not, and what it has ended since boot",
        description="Whether the guardian is installed and runs, why not (no registry "
        "yet, one it cannot use and waits for, no guardian.json, one naming a process that "
        "is gone), whether systemd lingering is off, and what it ended since boot. Exit "
        "codes: 0 the guardian runs, 1 it does not (waiting for its registry included).",
    )
    status.add_argument("--json", action="store_true")


_COMMANDS: Final[
    tuple[tuple[str, str, str | None, Callable[[argparse.ArgumentParser], None]], ...]
] = (
    (
        "scan",
        "list orphaned runners (signals nothing)",
        "List orphaned runners and what a sweep would signal with each; signal nothing. "
        "Exit codes: 0 none found, 1 orphans found, 2 usage or configuration error.",
        _scan_arguments,
    ),
    (
        "sweep",
        "end orphaned runners: SIGINT (SIGTERM if not exo's), a bounded wait, SIGKILL",
        "End orphaned runners the clean way first: an exo runner gets SIGINT on its main "
        "thread (it unwinds through Python; one busy in native code takes it when its "
        "call returns), then the busy wait; anything else (--match) gets SIGTERM, then "
        "the grace; SIGKILL for what is left. A runner already ending by itself, or that "
        "another sweeper began to end, is waited for first (not with --now). Exit codes: "
        "0 nothing left, 1 orphans remain (one survived SIGKILL, one was left ending by "
        "itself, or another sweep held the registry's lock), 2 usage or configuration "
        "error.",
        _sweep_arguments,
    ),
    (
        "patch",
        "put the guard's hooks into an exo source tree",
        "Exit codes: check: 0 applied, 1 not applied; apply/revert: 0 done or nothing to do "
        "(a uv lock that failed is a line saying what to run); export: 0 written; 2 not an "
        "exo tree, no series fits, a tree the series does not apply to (the error says "
        "where, why and what to do), a bad --source, or an --out that cannot be written.",
        _patch_arguments,
    ),
    (
        "explain",
        "cause and remedy for an error line or errno from exo's logs",
        "Exit codes: 0 explained, 1 not recognised.",
        _explain_arguments,
    ),
    (
        "doctor",
        "one screen about this node: guard, patch, orphans, registry, queue pairs",
        "Exit codes: 0 no FAIL line, 1 at least one FAIL line.",
        _doctor_arguments,
    ),
    (
        "exec",
        "run a command that dies with this wrapper's parent (mlx.launch ranks)",
        "Runs CMD as a guarded child: CMD and its tree die when this wrapper's parent dies, "
        "on SIGTERM/SIGINT/SIGHUP (forwarded, SIGKILL after the grace) and, with "
        "--stdin-hup, when stdin closes. Exits with CMD's status (128+N for signal N); "
        "126/127 if CMD cannot run; 2 usage error.",
        _exec_arguments,
    ),
    (
        "selftest",
        "prove the parent watch on this machine",
        "Start stand-in workers and runners, SIGKILL the workers, and check that each "
        "strategy's runners are gone (or, uncovered, alive). Exit codes: 0 every row "
        "passed, 1 a row failed, 2 usage error (a strategy this machine cannot use).",
        _selftest_arguments,
    ),
    (
        "service",
        "the guardian: run it, or have launchd or systemd keep it running",
        "The guardian: one process per user per machine that ends the runners of any exo "
        "process of that user that dies. Exit codes: see each subcommand's --help.",
        _service_arguments,
    ),
)
"""Each subcommand: its name, its line in `--help`, its own help's description (exit
codes), and what adds its arguments."""


def _add_host_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--hosts",
        metavar="H1,H2,...",
        help="run this on each host over ssh (BatchMode, in parallel), one report; "
        "exit code: the worst host's, 3 if a host could not be checked",
    )
    command.add_argument(
        "--hostfile", type=Path, metavar="PATH", help="the hosts of an mlx.launch hostfile"
    )


def _grace_argument(command: argparse.ArgumentParser, first: str, note: str = "") -> None:
    command.add_argument(
        "--grace",
        type=_seconds,
        metavar="SECONDS",
        help=f"between {first} and SIGKILL (default ${settings.GRACE_ENV} or "
        f"{settings.DEFAULT_GRACE_SECONDS:g}{note})",
    )


def _seconds(text: str) -> float:
    # An explicit grace is this command's own choice: the floor is the environment's.
    parsed = settings.parse_grace(text, floor=0.0)
    if parsed.warning is not None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds in 0..{settings.MAX_GRACE_SECONDS:g}"
        )
    return parsed.value


def forwarded_words(arguments: argparse.Namespace, command: str) -> list[str]:
    """The words that give `command` on another host what these arguments asked for
    here (`--hosts` and `--hostfile` name the hosts, so they stay on this side)."""
    words = [command, *(["--json"] if arguments.json else [])]
    if command == "doctor":
        return words + (["--exo", str(arguments.exo)] if arguments.exo is not None else [])
    words += ["--registry-only"] if arguments.registry_only else []
    words += ["--match", arguments.match] if arguments.match is not None else []
    words += ["--any-parent"] if arguments.any_parent else []
    words += ["--all-users"] if arguments.all_users else []
    words += ["--dir", str(arguments.dir)] if arguments.dir is not None else []
    words += ["--all"] if command == "scan" and arguments.all else []
    if command == "sweep":
        words += ["--dry-run"] if arguments.dry_run else []
        words += ["--grace", f"{arguments.grace!r}"] if arguments.grace is not None else []
        words += ["--now"] if arguments.now else []
    return words
