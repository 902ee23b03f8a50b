"""`exo-orphan-guard patch export --bugfix --exo PATH [--out DIR]`: the bugfix series.

A series of its own, apart from the hooks, for a PR of its own: exo's own stop (Ctrl-C,
the app's quit, a runner's shutdown) ends an idle runner the clean way, exit 0 through
Python, instead of by SIGTERM. At main the supervisor closes the runner's task stream as
soon as it is cancelled, not after AsyncProcess's join and SIGTERM; at v1.0.71 the
worker's stop no longer cancels the supervisor's join (multiprocessing's atexit
SIGTERMed the runner). It needs nothing of this package.

The stored series are `patches/bugfix/<version>/` (`git format-patch` files). The one
written is the one `git apply --check` accepts in the tree; none is written where none
does (exit 2), or where one is in already (exit 0, said so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Final

BUGFIX_DIR: Final = Path(__file__).resolve().parent / "patches" / "bugfix"
VERSIONS: Final = ("main", "v1.0.71")
"""The exo versions a stored bugfix series was written for, newest first."""


class BugfixError(Exception):
    """One line for the operator; nothing was written."""


def patches(version: str) -> list[Path]:
    """The stored series for `version`, in order."""
    return sorted((BUGFIX_DIR / version).glob("*.patch"))


def applies(tree: Path, version: str, *, reverse: bool = False) -> bool:
    """Whether `git apply --check` (`-R`: taken back) accepts `version`'s series in
    `tree`. Git looks for a repository at `tree` and no higher: inside another
    repository's subdirectory it would skip the paths outside it and accept anything."""
    git = shutil.which("git")
    if git is None:
        raise BugfixError("git is not on PATH: it checks which bugfix series fits the tree")
    command = [git, "apply", "--check", *(["-R"] if reverse else []), *map(str, patches(version))]
    environment = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    checked = subprocess.run(command, cwd=tree, env=environment, capture_output=True, check=False)
    return checked.returncode == 0


def fitting(tree: Path) -> str | None:
    """The version whose bugfix series applies to `tree` as it is."""
    return next((version for version in VERSIONS if applies(tree, version)), None)


def export(tree: Path, out: Path | None, say: Callable[[str], None] = print) -> int:
    if not tree.is_dir():
        raise BugfixError(f"{tree} is not a directory")
    version = fitting(tree)
    if version is None:
        present = next((v for v in VERSIONS if applies(tree, v, reverse=True)), None)
        if present is not None:
            say(f"bugfix series {present}: already in {tree}")
            return 0
        raise BugfixError(
            f"no bugfix series applies to {tree} (written for exo {', '.join(VERSIONS)}): "
            "its supervisor differs; see docs/exo.md, 'The bugfix series'"
        )
    target = (out or Path(f"exo-bugfix-{version}")).expanduser().resolve()
    try:
        target.mkdir(parents=True, exist_ok=True)
        for patch in patches(version):
            (target / patch.name).write_bytes(patch.read_bytes())
    except OSError as error:
        raise BugfixError(f"cannot write {error.filename}: {error.strerror}") from error
    say(f"bugfix series {version}: git apply --check accepts it in {tree}")
    count = len(patches(version))
    say(f"wrote {count} patch{'' if count == 1 else 'es'} to {target}")
    say(f"to apply them as commits: git -C {tree} am {target}/*.patch")
    return 0
