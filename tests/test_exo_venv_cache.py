"""scripts/exo-venv keeps its cache to what can be used again: a thin venv whose exo
tree is gone (every test session's trees are temporary) is dropped, with its lock,
when the next one is made; the venv of a tree that is still there stays.

Needs EXO_SRC and MLX_LM_SRC, as `make test-exo`; the base venv is the one the other
exo tests use (built once, cached).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.exo_trees import REPO, exo_tree, mlx_lm_src

pytestmark = [pytest.mark.exo, pytest.mark.skipif(sys.platform != "linux", reason="Linux only")]


def _thin_venv(tree: Path, cache: Path) -> Path:
    built = subprocess.run(
        [str(REPO / "scripts" / "exo-venv"), str(tree), str(cache), "--runner", str(mlx_lm_src())],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(built.stdout.strip().splitlines()[-1])


def test_a_thin_venv_whose_tree_is_gone_is_dropped(exo_work: Path, exo_venv_cache: Path) -> None:
    pristine = exo_tree(exo_work, "main", patched=False)
    kept, gone = exo_work / "venv-cache-kept", exo_work / "venv-cache-gone"
    shutil.copytree(pristine, kept, symlinks=True)
    shutil.copytree(pristine, gone, symlinks=True)
    kept_venv, gone_venv = _thin_venv(kept, exo_venv_cache), _thin_venv(gone, exo_venv_cache)
    gone_lock = exo_venv_cache / "locks" / f"{gone_venv.name}.lock"
    assert kept_venv != gone_venv and gone_venv.is_dir() and gone_lock.is_file()
    shutil.rmtree(gone)

    assert _thin_venv(kept, exo_venv_cache) == kept_venv

    assert not gone_venv.exists() and not gone_lock.exists()
    assert (kept_venv / ".exo-venv-complete").is_file()
    shutil.rmtree(kept)
