"""`patch apply --source` on exo's real uv project, at the two commits the stored
series fits.

exo's lock pulls mlx from git and GitHub release URLs. Where those hosts cannot be
reached (as on this project's machines), `uv lock` cannot run, and the test checks
what an operator then gets: the patch applied, the lock failure in one line naming
what to run, `uv.lock` untouched, and revert giving back the tree byte for byte.
Where they can, it checks the new lock instead: exo-orphan-guard added, exo's psutil
kept. Needs EXO_SRC (see tests/helpers/exo_trees.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from exo_orphan_guard.exo import patching

from .helpers.cli import run_cli
from .helpers.dist import UV, built_dist
from .helpers.exo_trees import COMMITS, SERIES_VERSIONS, exo_src

pytestmark = [pytest.mark.exo, pytest.mark.skipif(sys.platform != "linux", reason="Linux only")]


def real_exo(root: Path, version: str) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(exo_src()), "archive", COMMITS[version]],
        capture_output=True,
        check=True,
    )
    tree = root / version
    tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def tree_digests(tree: Path) -> dict[str, str]:
    return {
        str(path.relative_to(tree)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in tree.rglob("*")
        if path.is_file() and not path.is_symlink()
    }


def uv_environment(cache: Path) -> dict[str, str]:
    environment = dict(os.environ)
    environment.update(
        PATH=f"{UV.parent}{os.pathsep}{environment.get('PATH', '')}",
        UV_CACHE_DIR=str(cache),
        UV_PYTHON_DOWNLOADS="never",
    )
    python313 = shutil.which("python3.13")
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        prefix = subprocess.run(
            [pyenv, "prefix", "3.13.0"], capture_output=True, text=True, check=False
        )
        if prefix.returncode == 0:
            python313 = f"{prefix.stdout.strip()}/bin/python3.13"
    if python313 is not None:
        environment["UV_PYTHON"] = python313
    environment.pop("VIRTUAL_ENV", None)
    environment["XDG_STATE_HOME"] = os.environ["XDG_STATE_HOME"]  # this test's own
    return environment


def cli(environment: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*arguments, env=environment, timeout=900)


def locked(tree: Path) -> dict[str, str]:
    packages: list[dict[str, str]] = tomllib.loads((tree / "uv.lock").read_text())["package"]
    return {package["name"]: package.get("version", "") for package in packages}


@pytest.mark.parametrize("version", SERIES_VERSIONS)
def test_apply_with_a_source_on_real_exo_locks_or_says_why_and_reverts_exactly(
    tmp_path: Path, version: str
) -> None:
    tree = real_exo(tmp_path, version)
    environment = uv_environment(tmp_path / "uv-cache")
    wheel = built_dist().wheel
    before = tree_digests(tree)
    exo_psutil = locked(tree)["psutil"]
    assert exo_psutil == "7.2.1"
    baseline = subprocess.run(
        [str(UV), "lock", "--check", "--offline"],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert baseline.returncode == 0, f"exo's own lock is not current: {baseline.stderr}"

    applied = cli(environment, "patch", "apply", "--exo", str(tree), "--source", str(wheel))
    lines = applied.stdout.splitlines()
    series = next(s for s in patching.load_series() if s.name == version)
    files = len(series.files)
    assert lines[0] == f"series {version} ({files} files) applied in {tree}"
    # --source adds the extra: the local series goes on top of the PR.
    assert lines[1] == f"local series {version} (the package's part inside exo): applied"
    del lines[1]
    assert lines[1] == f"source: {wheel} (wheel), with the orphan-guard extra"
    assert f'exo-orphan-guard = {{ path = "{wheel}" }}\n' in (tree / "pyproject.toml").read_text()
    assert applied.returncode == 0, applied.stderr
    if lines[2].startswith("uv.lock: locked ("):
        assert "exo-orphan-guard" in locked(tree)
        assert locked(tree)["psutil"] == exo_psutil
    else:
        assert lines[2].startswith("uv.lock: uv lock failed, the patch stays applied: error: ")
        assert lines[2].endswith(f"run: cd {tree} && uv lock")
        assert tree_digests(tree)["uv.lock"] == before["uv.lock"]
    assert len(lines) == 3

    checked = cli(environment, "patch", "check", "--exo", str(tree))
    assert checked.stdout.splitlines()[:3] == [
        f"series {version} fits {tree}: applied",
        "local series (the package's part inside exo): applied",
        f"source: {wheel}",
    ]

    reverted = cli(environment, "patch", "revert", "--exo", str(tree))
    assert reverted.returncode == 0, reverted.stderr
    assert tree_digests(tree) == before


@pytest.mark.parametrize("version", list(COMMITS))
def test_without_a_source_real_exos_lock_stays_current(tmp_path: Path, version: str) -> None:
    """Issue 29, item 1: the series adds no extra, so exo's own lock stays current with
    the package on no index (the seven-patch series' extra made it stale)."""
    tree = real_exo(tmp_path, version)
    environment = uv_environment(tmp_path / "uv-cache")
    before = tree_digests(tree)
    applied = cli(environment, "patch", "apply", "--exo", str(tree))
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines()[3] == (
        "uv.lock: nothing to lock (pyproject.toml is unchanged)"
    )
    check = subprocess.run(
        [str(UV), "lock", "--check", "--offline"],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert tree_digests(tree)["pyproject.toml"] == before["pyproject.toml"]
    reverted = cli(environment, "patch", "revert", "--exo", str(tree))
    assert reverted.returncode == 0, reverted.stderr
    assert tree_digests(tree) == before
