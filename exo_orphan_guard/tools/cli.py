"""`exo-orphan-guard`: the operator's command line.

Exit codes: 0 nothing left (or all checks passed), 1 orphans or failures remain,
2 usage or configuration error. Errors are one line on stderr, never a traceback.

Each command imports what it uses when it runs: `scan` starts without anyio or loguru
(CLI start-up is measured in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Final, NoReturn, TextIO, final

from ..records.guardian_state import Mode
from ..system import once, settings
from .arguments import UsageError, build_parser, forwarded_words

EXIT_OK: Final = 0
EXIT_LEFT: Final = 1
EXIT_USAGE: Final = 2


def main(argv: Sequence[str] | None = None) -> int:
    with _own_output():
        return _run(argv)


@contextlib.contextmanager
def _own_output() -> Generator[None]:
    """The command line's warnings in its own words, and a stdout whose reader may
    leave; both as they were once it returns (a caller in the same process, a test)."""
    sink = once.warn_to(_warn_on_stderr)
    stdout = sys.stdout
    keep_writing_when_the_reader_leaves()
    try:
        yield
    finally:
        once.warn_to(sink)
        sys.stdout = stdout


def _run(argv: Sequence[str] | None) -> int:
    try:
        arguments = build_parser().parse_args(argv)
        return _dispatch(arguments)
    except UsageError as error:
        print(f"exo-orphan-guard: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:  # an unreadable --dir or --exo, say: one line, no traceback
        print(f"exo-orphan-guard: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("exo-orphan-guard: interrupted", file=sys.stderr)
        return 130


def _warn_on_stderr(message: str) -> None:
    # A warning nobody can read (stderr on a full disk, a closed pipe) is dropped, as
    # the guardian's own lines are: it is never a reason to stop.
    with contextlib.suppress(OSError):
        print(f"exo-orphan-guard: warning: {message}", file=sys.stderr, flush=True)


def keep_writing_when_the_reader_leaves() -> None:
    """A reader that leaves early (`exo-orphan-guard patch apply ... | head -2`) costs
    the rest of the output, never the rest of the work: from the first write that
    fails, stdout is /dev/null, and the command ends as it would have."""
    if not isinstance(sys.stdout, _ReaderMayLeave):
        sys.stdout = _ReaderMayLeave(sys.stdout)


@final
class _ReaderMayLeave(io.TextIOBase):
    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream

    def write(self, text: str, /) -> int:
        try:
            self._stream.write(text)
        except BrokenPipeError:
            self._to_nowhere()
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_nowhere()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def _to_nowhere(self) -> None:
        # What the stream still buffers goes there too, at the latest at the exit's flush.
        nowhere = os.open(os.devnull, os.O_WRONLY)
        os.dup2(nowhere, self._stream.fileno())
        os.close(nowhere)


def _dispatch(arguments: argparse.Namespace) -> int:
    command: str = arguments.command
    match command:
        case "scan" | "sweep" | "doctor" if arguments.hosts or arguments.hostfile:
            return _on_hosts(arguments, command)
        case "scan" | "sweep":
            return _sweep(arguments, command)
        case "patch":
            return _patch(arguments)
        case "explain":
            return _explain(arguments)
        case "doctor":
            return _doctor(arguments)
        case "selftest":
            return _selftest(arguments)
        case "exec":
            return _exec(arguments)
        case "service":
            return _service(arguments)
        case _:
            raise UsageError(f"unknown command {command!r}")


def _sweep(arguments: argparse.Namespace, command: str) -> int:
    from ..sweeper import report_format
    from ..sweeper.sweeping import sweep

    dry_run = command == "scan" or bool(arguments.dry_run)
    now = command == "sweep" and bool(arguments.now)
    grace: float | None = None if command == "scan" else arguments.grace
    if now:
        print(NOW_WARNING, file=sys.stderr, flush=True)
        grace = 0.0 if grace is None else grace
    try:
        report = sweep(
            dry_run=dry_run,
            registry_dir=arguments.dir,
            grace=grace,
            fingerprint=not arguments.registry_only,
            match=arguments.match,
            any_parent=arguments.any_parent,
            all_users=arguments.all_users,
            wait_for_endings=not now,
            on_wait=_say_on_stderr,
        )
    except ValueError as error:
        raise UsageError(str(error)) from error
    if arguments.json:
        print(report_format.to_json(report, command))
    else:
        print(report_format.to_table(report, show_spared=command == "scan" and arguments.all))
    return report.exit_code


NOW_WARNING = (
    "exo-orphan-guard sweep --now: killing without waiting for runners that are ending "
    "the clean way or busy in native code; on macOS a hard kill of a process holding "
    "wired Metal memory can strand it until a reboot"
)


def _say_on_stderr(line: str) -> None:
    print(f"exo-orphan-guard sweep: {line}", file=sys.stderr, flush=True)


def _patch(arguments: argparse.Namespace) -> int:
    from ..exo import patch_command

    action: patch_command.Action = arguments.action
    source: Path | None = arguments.source
    out: Path | None = arguments.out
    for flag, given in (("--source", source is not None), ("--no-lock", arguments.no_lock)):
        if given and action != "apply":
            raise UsageError(f"{flag} is for apply, not {action}")
    with_package: bool = arguments.with_package
    if with_package and action not in ("apply", "export"):
        raise UsageError(f"--with-package is for apply and export, not {action}")
    if out is not None and action != "export":
        raise UsageError(f"--out is for export, not {action}")
    tree: Path = arguments.exo.expanduser().resolve()
    if arguments.bugfix:
        return _bugfix(action, tree, out)
    try:
        return patch_command.run(
            action, tree, source, lock=not arguments.no_lock, out=out, with_package=with_package
        )
    except patch_command.PatchCommandError as error:
        raise UsageError(str(error)) from error


def _bugfix(action: str, tree: Path, out: Path | None) -> int:
    from ..exo import bugfix

    if action != "export":
        raise UsageError(f"--bugfix is for export, not {action}")
    try:
        return bugfix.export(tree, out)
    except bugfix.BugfixError as error:
        raise UsageError(str(error)) from error


def _explain(arguments: argparse.Namespace) -> int:
    from ..exo import explain

    words: list[str] = arguments.text
    text = " ".join(words)
    found = explain.explain(text)
    if arguments.json:
        print(
            json.dumps(
                {
                    "schema": "exo-orphan-guard/explain/1",
                    "text": text,
                    "explanations": [dataclasses.asdict(explanation) for explanation in found],
                },
                indent=2,
            )
        )
    else:
        print(explain.render(text, found))
    return EXIT_OK if found else EXIT_LEFT


def _doctor(arguments: argparse.Namespace) -> int:
    from . import check, doctor

    exo_tree: Path | None = arguments.exo
    checks = doctor.assess(
        doctor.gather(None if exo_tree is None else exo_tree.expanduser().resolve())
    )
    print(check.to_json(checks) if arguments.json else check.render(checks))
    return check.exit_code(checks)


def _on_hosts(arguments: argparse.Namespace, command: str) -> int:
    from . import remote

    try:
        hosts = remote.parse_host_list(arguments.hosts) if arguments.hosts else []
        if arguments.hostfile is not None:
            hosts += remote.parse_hostfile(arguments.hostfile)
        if command != "doctor":
            remote.check_sweep_arguments(arguments.match, arguments.any_parent)
    except ValueError as error:
        raise UsageError(str(error)) from error
    report = remote.run_on_hosts(hosts, command, forwarded_words(arguments, command))
    print(remote.to_json(report) if arguments.json else remote.to_text(report))
    return report.exit_code


def _exec(arguments: argparse.Namespace) -> int:
    from ..watch import exec_wrapper

    try:
        command = exec_wrapper.parse_command(arguments.argv)
    except ValueError as error:
        raise UsageError(str(error)) from error
    options = exec_wrapper.ExecOptions(command, arguments.grace, arguments.stdin_hup)
    return exec_wrapper.run(options)


def _selftest(arguments: argparse.Namespace) -> int:
    from . import selftest

    chosen: list[settings.Strategy] | None = arguments.strategy
    unusable = [name for name in chosen or () if name not in selftest.strategies_here()]
    if unusable:
        raise UsageError(f"--strategy {unusable[0]} is not usable on this machine")
    if arguments.json:
        results = selftest.run_selftest(chosen)
        print(selftest.to_json(results))
        return EXIT_OK if all(result.passed for result in results) else EXIT_LEFT
    print(selftest.render_header(), flush=True)
    results = selftest.run_selftest(
        chosen, progress=lambda result: print(selftest.render_row(result), flush=True)
    )
    print()
    print(selftest.render_verdict(results))
    return EXIT_OK if all(result.passed for result in results) else EXIT_LEFT


def _service(arguments: argparse.Namespace) -> int:
    action: str = arguments.action
    if action == "run":
        from ..guardian import service_run

        mode: Mode = arguments.mode
        watch: list[int] = arguments.watch
        return service_run.run(mode, leave_when_idle=arguments.leave_when_idle, watch=watch)
    from . import service

    context = service.here()
    if action == "install":
        return service.install(context, print_only=arguments.print_only)
    if action == "uninstall":
        return service.uninstall(context)
    return service.status(context, as_json=arguments.json)


def entry_point() -> NoReturn:
    sys.exit(main())
