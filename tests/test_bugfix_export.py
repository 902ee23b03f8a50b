"""`patch export --bugfix` where no stored bugfix series fits, without exo: nothing is
written and the exit is 2, also for a tree inside another git repository (where git
apply, run from a subdirectory, would skip every path outside it and accept the series).
The trees the series fits are tests/test_exo_bugfix.py's, with EXO_SRC."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from exo_orphan_guard.exo import bugfix

REPO = Path(__file__).resolve().parent.parent


def cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exo_orphan_guard", *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_tree_no_series_fits_gets_nothing(tmp_path: Path) -> None:
    tree = tmp_path / "not-exo"
    (tree / "src").mkdir(parents=True)
    done = cli("patch", "export", "--bugfix", "--exo", str(tree), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no bugfix series applies" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_subdirectory_of_another_repository_is_not_taken_for_a_fit(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tree = tmp_path / "exo"
    tree.mkdir()
    assert all(not bugfix.applies(tree, version) for version in bugfix.VERSIONS)
    done = cli("patch", "export", "--bugfix", "--exo", str(tree), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr


def test_bugfix_is_for_export_only(tmp_path: Path) -> None:
    done = cli("patch", "check", "--bugfix", "--exo", str(tmp_path))
    assert done.returncode == 2
    assert "--bugfix is for export, not check" in done.stderr
