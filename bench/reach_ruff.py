"""exo's own ruff for `make reach`: the version a tree's `uv.lock` pins, installed once
under `.cache/ruff/<version>`, and its findings on a few files without their line
numbers, so that the findings of a tree before and after the hooks compare."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
RUFF_CACHE: Final = ROOT / ".cache" / "ruff"
RUFF_PIN: Final = re.compile(r'^name = "ruff"\nversion = "([^"]+)"', re.MULTILINE)


def pinned_ruff(tree: Path) -> str | None:
    """The ruff version the tree's `uv.lock` pins (None: no lock, or no ruff in it)."""
    try:
        found = RUFF_PIN.search((tree / "uv.lock").read_text())
    except (OSError, UnicodeDecodeError):
        return None
    return found.group(1) if found else None


def ruff_binary(version: str) -> Path:
    """exo's pinned ruff, installed once under `.cache/ruff/<version>`."""
    target = RUFF_CACHE / version
    binary = target / "bin" / "ruff"
    if not binary.exists():
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"),
                *("--target", str(target), f"ruff=={version}"),
            ],
            check=True,
        )
    return binary


@dataclass(frozen=True, slots=True)
class RuffResult:
    findings: tuple[str, ...]
    """Each finding without its line numbers: `ruff check` lines (file, rule, message)
    and the lines `ruff format --diff` would change."""


def ruff_findings(version: str, tree: Path, files: Sequence[str]) -> RuffResult:
    """Both of exo's ruff checks on `files`, with the tree's own config."""
    binary = ruff_binary(version)
    findings: list[str] = []
    for command in (
        ["check", "--output-format", "concise"],
        ["format", "--diff"],
    ):
        result = subprocess.run(
            [str(binary), *command, "--no-cache", *files],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(binary.parent.parent)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            continue
        if command[0] == "check":
            findings += [
                re.sub(r":\d+:\d+:", ":", line)
                for line in result.stdout.splitlines()
                if re.match(r"^\S+:\d+:\d+: ", line)
            ]
        else:
            findings += [
                f"format: {line}"
                for line in result.stdout.splitlines()
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            ]
        if not findings:  # failed without a finding: ruff itself failed
            findings.append(f"ruff {command[0]}: {result.stderr.strip()[:200]}")
    return RuffResult(tuple(findings))
