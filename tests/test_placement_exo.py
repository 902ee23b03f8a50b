"""Placement on exo's own trees (issue 28), with EXO_SRC (skipped without it): v1.0.61
and v1.0.65, which the stored series does not fit, are placed, pass exo's pinned ruff
and revert byte for byte; and the stored series is exactly what placement writes for
the trees it was written for."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from exo_orphan_guard.exo import anchors, patch_command, patch_format, patching, placement
from exo_orphan_guard.tools import cli
from tests.test_patching import snapshot
from tests.test_placement import GIT, git_tree

EXO_SRC = os.environ.get("EXO_SRC", "")
NEEDS_EXO = pytest.mark.skipif(
    not (EXO_SRC and Path(EXO_SRC, ".git").exists()),
    reason="needs a git clone of exo-explore/exo in EXO_SRC (make test-exo EXO_SRC=...)",
)


def archived(revision: str, tree: Path) -> dict[str, bytes]:
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", EXO_SRC, "archive", revision], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return snapshot(tree)


def pinned_ruff(tree: Path) -> Path | None:
    """exo's ruff as the tree's uv.lock pins it, if `make reach` cached it."""
    from bench import reach_ruff

    version = reach_ruff.pinned_ruff(tree)
    binary = reach_ruff.RUFF_CACHE / version / "bin" / "ruff" if version else None
    return binary if binary is not None and binary.exists() else None


@NEEDS_EXO
@pytest.mark.parametrize("revision", ["v1.0.61", "v1.0.65"])
def test_exo_releases_the_stored_series_does_not_fit_are_placed(
    tmp_path: Path, revision: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "exo"
    original = archived(revision, tree)
    # The stored series its supervisor file picks does not fit it: placement does.
    current = patching._series_for(tree, patching.load_series())  # pyright: ignore[reportPrivateUsage]
    assert current is not None
    contents = {path: original.get(path) for path in current.files}
    fits = patch_format.apply_diffs(current.diffs, contents, reverse=False)
    assert not isinstance(fits, dict)
    status, changed = patching.apply(tree, with_package=True)
    assert changed and status.series.name == patching.PLACED
    changed_files = [anchors.ENTRYPOINT_FILE, anchors.WORKER_FILE, anchors.CONSTANTS_FILE]
    new = [*placement.new_files(placement.RELAY), *placement.new_files(placement.WITH_PACKAGE)]
    ruff = pinned_ruff(tree)
    if ruff is not None:
        for command in (["check"], ["format", "--check"]):
            result = subprocess.run(
                [str(ruff), *command, "--no-cache", *changed_files, *new],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(ruff.parent.parent)},
                capture_output=True,
                text=True,
                check=False,
            )
            assert result.returncode == 0, result.stdout + result.stderr
    patched = snapshot(tree)
    assert patching.revert(tree)[1] is True and snapshot(tree) == original
    # export, then git am onto the pristine tree: the same bytes as apply.
    git_tree(tree)
    assert cli.main(["patch", "export", "--exo", str(tree), "--out", str(tmp_path / "out")]) == 0
    assert (
        cli.main(
            [
                "patch",
                "export",
                "--exo",
                str(tree),
                "--with-package",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    for directory in (tmp_path / "out", tmp_path / "out" / "with-package"):
        patches = sorted(str(path) for path in directory.glob("000[1-9]-*.patch"))
        subprocess.run([*GIT, "-C", str(tree), "am", "-q", *patches], check=True)
    assert {
        path: data for path, data in snapshot(tree).items() if not path.startswith(".git/")
    } == patched


@NEEDS_EXO
@pytest.mark.parametrize("name", ["main", "v1.0.71"])
def test_the_stored_series_is_what_placement_writes_for_its_tree(tmp_path: Path, name: str) -> None:
    """So the stored series and placement can never disagree on the trees both fit."""
    tree = tmp_path / "exo"
    original = archived({"main": "b5375f8cee43", "v1.0.71": "v1.0.71"}[name], tree)
    generated = dict(patch_command._generated(tree, imports_at_top=True))  # pyright: ignore[reportPrivateUsage]
    directory = patching.PATCHES_DIR / name
    stored = {path.name: path.read_bytes() for path in directory.glob("*.patch")}
    assert generated == stored
    local = dict(patch_command._generated_local(tree, imports_at_top=True))  # pyright: ignore[reportPrivateUsage]
    stored_local = patching.WITH_PACKAGE_DIR / name
    assert local == {path.name: path.read_bytes() for path in stored_local.glob("*.patch")}
    contents = {path: original.get(path) for path in placement.inputs()}
    placed = placement.placement(contents, placement.pr_footprint(contents))
    assert isinstance(placed, placement.Placed)
    at_top = placement.imports_at_top(placed)
    assert isinstance(at_top, placement.Placed)
    status, _ = patching.apply(tree, with_package=True)
    assert status.series.name == name  # the stored series, not placement
    assert status.local is not None and status.local.name == name
    patched = snapshot(tree)
    assert all(
        patched.get(path) == data
        for path, data in at_top.patched.items()
        if path != anchors.WORKER_FILE  # the local series changes it too
    )
