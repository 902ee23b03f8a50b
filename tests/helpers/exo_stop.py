"""exo's own stop, on pristine exo and on exo with the bugfix series (issue 35 item 6).

The trees are exo at a version's commit (`exo_trees.exo_tree`, never the hooks), and
the same with `patches/bugfix/<version>/` applied by `git apply` (what `git am` of
`patch export --bugfix` gives, without the commit). The stop is
`tests/helpers/app_quit.py`'s `stop` scenario on exo's real Worker and
RunnerSupervisors: one SIGINT to exo's process, which exo's handler turns into its
own `shutdown()`, with an idle runner and one in a long `mx.eval`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from exo_orphan_guard.exo import bugfix
from tests.helpers.app_quit import Round, run_round
from tests.helpers.exo_trees import exo_tree, exo_venv

STOP_VERSIONS = ("v1.0.71", "main")
EVAL_SECONDS = 12.0
"""The busy runner's one `mx.eval`: longer than either version's join, so exo's
escalation, not the eval's end, ends it."""
OBSERVE_SECONDS = 25.0


def bugfix_tree(work: Path, version: str) -> Path:
    """A copy of exo at `version` with its stored bugfix series applied."""
    target = work / f"{version}-bugfix"
    if not target.exists():
        shutil.copytree(exo_tree(work, version, patched=False), target, symlinks=True)
        assert bugfix.applies(target, version), f"the bugfix series no longer fits {version}"
        subprocess.run(
            ["git", "apply", *map(str, bugfix.patches(version))],
            cwd=target,
            env={**os.environ, "GIT_CEILING_DIRECTORIES": str(target.parent)},
            check=True,
        )
    return target


def stop_round(version: str, *, fixed: bool, work: Path, venv_cache: Path) -> Round:
    """One round of exo's own stop; `fixed`: with the bugfix series."""
    tree = bugfix_tree(work, version) if fixed else exo_tree(work, version, patched=False)
    venv = exo_venv(tree, venv_cache, runner=True)
    return run_round(
        tree,
        venv,
        version,
        config="off",
        scenario="stop",
        busy="eval",
        eval_seconds=EVAL_SECONDS,
        observe=OBSERVE_SECONDS,
    )
