"""The PR's own tests in exo's tree (issue 41 item 3), on real exo main with the PR
applied by `git am` and nothing of this package in exo's environment: they pass with
exo's CI options (`-m "not slow"`), and each file the PR changes or adds, put back as
exo main has it, makes at least one of them fail.

Needs EXO_SRC and MLX_LM_SRC (exo's runner loads mlx): `make test-exo`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from exo_orphan_guard.exo import footprints, patching, placement

from .helpers.exo_trees import COMMITS, exo_environment, exo_src, exo_venv

pytestmark = [
    pytest.mark.exo,
    pytest.mark.machine_wide,  # the tests end recorded leftovers: confined only
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
]
GIT = ["git", "-c", "user.name=exo-orphan-guard test", "-c", "user.email=test@invalid"]
PR_TESTS = [footprints.WATCH_TEST, footprints.SWEEP_TEST]
PYTEST = ("-q", "-p", "no:cacheprovider", "-m", "not slow")
"""As exo's CI runs them."""


def _pr_tree(work: Path) -> Path:
    tree = work / "exo"
    subprocess.run(
        [*GIT, "clone", "-q", "--shared", "--no-checkout", str(exo_src()), str(tree)], check=True
    )
    subprocess.run([*GIT, "-C", str(tree), "checkout", "-q", COMMITS["main"]], check=True)
    patches = patching.patch_files(patching.PATCHES_DIR / "main")
    subprocess.run([*GIT, "-C", str(tree), "am", "-q", *map(str, patches)], check=True)
    return tree


def _run(tree: Path, venv: Path) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="eog-pr-tests-") as scratch:
        environment = exo_environment(Path(scratch), guard=None)
        environment.pop("PYTHONPATH", None)  # nothing of this checkout
        completed = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pytest", *PYTEST, *PR_TESTS],
            cwd=tree,
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    summary = completed.stdout.strip().splitlines()[-1] if completed.stdout.strip() else ""
    return {word: int(number) for number, word in re.findall(r"(\d+) (\w+)", summary)}


def test_the_prs_tests_pass_without_the_package_and_fail_with_any_file_put_back(
    tmp_path: Path, exo_venv_cache: Path
) -> None:
    tree = _pr_tree(tmp_path)
    venv = exo_venv(tree, exo_venv_cache, runner=True, package=False)
    passed = _run(tree, venv)
    assert passed == {"passed": 4}, passed
    changed = subprocess.run(
        ["git", "-C", str(tree), "diff", "--name-only", f"{COMMITS['main']}..HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    exos = [path for path in changed if path not in PR_TESTS]
    assert sorted(exos) == sorted(
        path for path in placement.WORK_QUEUE.files if path not in PR_TESTS
    )
    for path in exos:
        subprocess.run(
            [*GIT, "-C", str(tree), "checkout", "-q", COMMITS["main"], "--", path], check=False
        )
        if path in placement.WORK_QUEUE.added:
            (tree / path).unlink()  # not in exo main
        failed = _run(tree, venv)
        print(f"{path} put back: {failed}")
        assert "failed" in failed or "error" in failed or "errors" in failed, (path, failed)
        subprocess.run([*GIT, "-C", str(tree), "checkout", "-q", "HEAD", "--", path], check=True)
