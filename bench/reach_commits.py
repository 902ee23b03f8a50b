"""Which of exo's commits `make reach` measures: the first-parent line at a step, the
releases on it or off it, or single revisions (a fork's heads)."""

from __future__ import annotations

import datetime
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

RELEASE: Final = re.compile(r"^v\d+\.\d+\.\d+$")


@dataclass(frozen=True, slots=True)
class Commit:
    sha: str
    date: str
    """Committer date, ISO 8601."""
    index: int | None
    """Position on the first-parent line from `--from` (0), or None: off it."""
    release: str | None
    """The release tag at this commit, if any."""


def pick(first_parent: Sequence[str], step: int) -> list[int]:
    """Indices into `first_parent` (oldest first) measured at `step`: every step-th
    from the first, and the last."""
    if not first_parent:
        return []
    return sorted({*range(0, len(first_parent), step), len(first_parent) - 1})


def select(exo_src: Path, start: str, end: str, step: int) -> list[Commit]:
    # `start^..end`, but `start` may be a root commit (no `start^`): `--not start^@`.
    listed = git_output(
        exo_src, "rev-list", "--first-parent", "--reverse", end, "--not", f"{start}^@"
    )
    first_parent = listed.split()
    chosen = {first_parent[index]: index for index in pick(first_parent, step)}
    position = {sha: index for index, sha in enumerate(first_parent)}
    releases: dict[str, str] = {}
    # Releases after `start`, on the first-parent line or not (v1.0.64 to v1.0.67 sit on
    # a release branch that main never merged), up to the newest `end` has.
    newest = git_output(
        exo_src, "describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", end
    ).strip()
    for tag in git_output(exo_src, "tag", "--contains", start).split():
        if RELEASE.match(tag) and _version(tag) <= _version(newest):
            releases[git_output(exo_src, "rev-list", "-n1", tag).strip()] = tag
    wanted = [*chosen, *(sha for sha in releases if sha not in chosen)]
    dates = dict(
        line.split(" ", 1)
        for line in git_output(exo_src, "show", "-s", "--format=%H %cI", *wanted).splitlines()
    )
    commits = [Commit(sha, dates[sha], position.get(sha), releases.get(sha)) for sha in wanted]
    return sorted(commits, key=lambda commit: datetime.datetime.fromisoformat(commit.date))


def heads(exo_src: Path, revisions: Sequence[str]) -> list[Commit]:
    """Single commits (a fork's heads), off exo's first-parent line."""
    shas = [git_output(exo_src, "rev-parse", f"{rev}^{{commit}}").strip() for rev in revisions]
    dates = dict(
        line.split(" ", 1)
        for line in git_output(exo_src, "show", "-s", "--format=%H %cI", *shas).splitlines()
    )
    return [Commit(sha, dates[sha], None, None) for sha in shas]


def git_output(exo_src: Path, *arguments: str) -> str:
    return subprocess.run(
        ["git", "-C", str(exo_src), *arguments], capture_output=True, text=True, check=True
    ).stdout


def _version(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", tag)[:3])
