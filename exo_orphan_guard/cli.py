"""`exo-orphan-guard`: the operator's command line.

Exit codes: 0 nothing left (or all checks passed), 1 orphans or failures remain,
2 usage or configuration error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Final, NoReturn, final

from . import selftest, settings

EXIT_OK: Final = 0
EXIT_LEFT: Final = 1
EXIT_USAGE: Final = 2


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
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    test = commands.add_parser("selftest", help="prove the parent watch on this machine")
    test.add_argument(
        "--strategy",
        action="append",
        choices=selftest.strategies_here(),
        help="only this strategy (repeatable); default: every one this OS offers",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        arguments = build_parser().parse_args(argv)
        return _dispatch(arguments)
    except UsageError as error:
        print(f"exo-orphan-guard: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("exo-orphan-guard: interrupted", file=sys.stderr)
        return 130


def _dispatch(arguments: argparse.Namespace) -> int:
    command: str = arguments.command
    match command:
        case "selftest":
            return _selftest(arguments)
        case _:
            raise UsageError(f"unknown command {command!r}")


def _selftest(arguments: argparse.Namespace) -> int:
    chosen: list[settings.Strategy] | None = arguments.strategy
    results = selftest.run_selftest(
        chosen, progress=lambda result: print(selftest.render_row(result), flush=True)
    )
    print()
    print(selftest.render(results))
    return EXIT_OK if all(result.passed for result in results) else EXIT_LEFT


def entry_point() -> NoReturn:
    sys.exit(main())
