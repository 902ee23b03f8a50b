"""Every command, flag and environment variable the README names exists: a newcomer
who copies a line from it gets the CLI it describes, not a usage error."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from exo_orphan_guard.tools.arguments import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_COMMAND = re.compile(r"exo-orphan-guard((?: +[a-z][-a-z]*| +--?[a-z][-a-z]*(?:[ =][^\s`]+)?)+)")
_VARIABLE = re.compile(r"\bEXO_ORPHAN_GUARD(?:_[A-Z]+)*\b")


_CODE = re.compile(r"^```[a-z]*\n(.*?)^```$|`([^`\n]+)`", flags=re.DOTALL | re.MULTILINE)


def _commands(text: str) -> list[list[str]]:
    """The words after each `exo-orphan-guard` in the README's code (blocks and spans),
    up to what is not a word of the CLI (a path, a pipe, a comment); a log line's
    `exo-orphan-guard guardian:` is no command."""
    found: list[list[str]] = []
    for code in _CODE.finditer(text):
        shown = code.group(1) or code.group(2)
        for match in _COMMAND.finditer(shown):
            before = shown[: match.start()].split("\n")[-1].split(" ")
            if shown[match.end() : match.end() + 1] == ":" or before[-2:-1] == ["--with"]:
                continue  # a log line's prefix; the checkout `uv run --with` adds
            words = shlex.split(match.group(1))
            if words:
                found.append(words)
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public way to list them
        choices: object = action.choices
        if isinstance(choices, dict):
            return {
                str(name): sub
                for name, sub in choices.items()  # pyright: ignore[reportUnknownVariableType]
                if isinstance(sub, argparse.ArgumentParser)
            }
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def _check(words: list[str]) -> str | None:
    """What in `words` the CLI does not have, or None."""
    parser = build_parser()
    path: list[str] = []
    for word in words:
        if word == "--":
            break  # the command `exec` runs
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            if flag not in _flags(parser):
                return f"`exo-orphan-guard {' '.join(path)}` has no {flag}"
            continue
        choices = _subparsers(parser)
        if not choices:
            continue  # an argument of the command (a path, a pid, a regex)
        if word not in choices:
            return f"`exo-orphan-guard {' '.join(path)}` has no command {word!r}"
        parser = choices[word]
        path.append(word)
    return None


def test_the_readme_shows_commands() -> None:
    commands = _commands(README.read_text())
    assert {words[0] for words in commands} >= {"service", "doctor", "scan", "sweep"}


def test_every_command_and_flag_the_readme_shows_exists() -> None:
    problems = [problem for words in _commands(README.read_text()) if (problem := _check(words))]
    assert problems == []


def test_a_command_the_cli_does_not_have_is_caught() -> None:
    assert _check(["service", "instal"]) is not None
    assert _check(["sweep", "--graceful"]) is not None
    assert _check(["sweep", "--grace", "5"]) is None


def test_every_environment_variable_the_readme_names_is_read_by_the_package() -> None:
    source = "\n".join(path.read_text() for path in (ROOT / "exo_orphan_guard").rglob("*.py"))
    named = set(_VARIABLE.findall(README.read_text()))
    assert named, "the README names no setting"
    assert sorted(name for name in named if f'"{name}"' not in source) == []
