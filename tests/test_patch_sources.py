"""`patch apply --source` and the undo record, without uv: on trees rebuilt from the
patches' pre-image lines (tests/test_patching.py). uv itself: test_exo_uv_install.py."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from exo_orphan_guard.exo import patching, uv_project
from exo_orphan_guard.tools import cli

from .test_patching import build_tree, snapshot

SERIES = next(series for series in patching.load_series() if series.name == "main")
GIT = shutil.which("git") or "git"  # found before no_uv empties PATH
PYPROJECT = b"""[project]
name = "exo"

[project.optional-dependencies]
build = ["nanobind"]
mlx-none = ["anyio"]
mlx = [
  "mlx==0.32.0",
]

[tool.uv.sources]
exo-rs = { workspace = true }
"""


def exo_tree(root: Path) -> Path:
    """Exo's files as the series expects them, and a pyproject.toml that is TOML."""
    tree = root / "exo"
    build_tree(tree, SERIES)
    (tree / "pyproject.toml").write_bytes(PYPROJECT)
    return tree


@pytest.fixture(autouse=True)
def state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Where the undo record of a tree that is not a git checkout goes."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


@pytest.fixture
def no_uv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    path = tmp_path / "dist" / "exo_orphan_guard-0.1.0-py3-none-any.whl"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("exo_orphan_guard/__init__.py", "")
    return path


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, list[str], str]:
    code = cli.main(list(arguments))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_source_entry_and_uv_lock_come_back_byte_for_byte(
    tmp_path: Path, wheel: Path, no_uv: None, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = exo_tree(tmp_path)
    (tree / "uv.lock").write_bytes(b"version = 1\n# exo's lock\n")
    before = snapshot(tree)

    code, out, _ = run(capsys, "patch", "apply", "--exo", str(tree), "--source", str(wheel))
    assert code == 0  # applied; the line below says uv.lock still needs locking
    # --source adds the extra: the local series goes in with the PR.
    assert out[1] == "local series main (the package's part inside exo): applied"
    assert out[2:] == [
        f"source: {wheel} (wheel), with the orphan-guard extra",
        "uv.lock: not updated (uv is not on PATH); until it is, `uv run exo` re-locks: "
        f"run: cd {tree} && uv lock",
    ]
    pyproject = (tree / "pyproject.toml").read_bytes()
    assert uv_project.declared_source(pyproject) == str(wheel)
    assert uv_project.undo_path(tree).exists()

    code, out, _ = run(capsys, "patch", "check", "--exo", str(tree))
    assert (code, out[1:]) == (
        0,
        [
            "local series (the package's part inside exo): applied",
            f"source: {wheel}",
            "uv.lock: not checked (uv is not on PATH)",
            f"undo record: {uv_project.undo_path(tree)} (what revert puts back)",
        ],
    )

    (tree / "uv.lock").write_bytes(b"version = 1\n# what uv lock would have written\n")
    code, out, _ = run(capsys, "patch", "revert", "--exo", str(tree))
    assert code == 0
    assert out[0] == "source: exo-orphan-guard entry removed"
    assert out[1] == "local series (the package's part inside exo) reverted"
    assert out[3] == f"uv.lock: changed after apply, left as it is: run: cd {tree} && uv lock"
    (tree / "uv.lock").write_bytes(before["uv.lock"])
    assert snapshot(tree) == before
    assert b"[tool.uv.sources]\n" + uv_project.Source(wheel, "wheel").entry_line() in pyproject
    # The series adds no extra (issue 29): --source adds it, here only, then takes it out.
    assert b'mlx = [\n  "mlx==0.32.0",\n]\norphan-guard = ["exo-orphan-guard"]\n' in pyproject


def test_without_a_readable_undo_record_revert_leaves_source_and_lock_and_says_so(
    tmp_path: Path, wheel: Path, no_uv: None, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = exo_tree(tmp_path)
    (tree / "uv.lock").write_bytes(b"version = 1\n")
    run(capsys, "patch", "apply", "--exo", str(tree), "--source", str(wheel))
    uv_project.undo_path(tree).write_text('{"uv.lock": {"before": "%%%", "after_sha256": ""}}')
    code, out, _ = run(capsys, "patch", "revert", "--exo", str(tree))
    assert code == 0
    assert out[0].startswith(
        f"source: no record of what apply changed ({uv_project.undo_path(tree)})"
    )
    assert out[2].endswith("reverted in " + str(tree)) and len(out) == 3
    assert uv_project.declared_source((tree / "pyproject.toml").read_bytes()) == str(wheel)
    assert not uv_project.undo_path(tree).exists()


def test_a_second_apply_with_another_source_replaces_the_entry_and_revert_still_restores(
    tmp_path: Path, wheel: Path, no_uv: None, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = exo_tree(tmp_path)
    before = snapshot(tree)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "exo-orphan-guard"\n')
    assert run(capsys, "patch", "apply", "--exo", str(tree), "--source", str(wheel))[0] == 0
    code, out, _ = run(capsys, "patch", "apply", "--exo", str(tree), "--source", str(checkout))
    assert code == 0 and "already applied: nothing changed" in out[0]
    assert out[2] == f"source: {checkout} (checkout), with the orphan-guard extra"
    text = (tree / "pyproject.toml").read_text()
    assert text.count("exo-orphan-guard = {") == 1 and str(wheel) not in text
    assert run(capsys, "patch", "revert", "--exo", str(tree))[0] == 0
    assert snapshot(tree) == before


def _missing(root: Path) -> Path:
    return root / "missing.whl"


def _other_wheel(root: Path) -> Path:
    return _file(root / "other-1.0-py3-none-any.whl")


def _not_a_tarball(root: Path) -> Path:
    return _file(root / "exo_orphan_guard-0.1.0.tar.gz")


def _other_project(root: Path) -> Path:
    return _project(root / "elsewhere", "other")


def _no_project(root: Path) -> Path:
    return root


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_missing, "no such file or directory"),
        (_other_wheel, "not a wheel"),
        (_not_a_tarball, "not a wheel"),
        (_other_project, "names 'other'"),
        (_no_project, "it has no pyproject.toml"),
    ],
)
def test_a_bad_source_is_one_line_and_changes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], Path],
    message: str,
) -> None:
    tree = exo_tree(tmp_path)
    before = snapshot(tree)
    scratch = tmp_path / "sources"
    scratch.mkdir()
    source = make(scratch)
    code, out, err = run(capsys, "patch", "apply", "--exo", str(tree), "--source", str(source))
    assert (code, out) == (2, [])
    assert err.count("\n") == 1 and message in err
    assert snapshot(tree) == before


def test_source_and_no_lock_are_for_apply_only(
    tmp_path: Path, wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for action in ("check", "revert"):
        assert run(capsys, "patch", action, "--exo", str(tmp_path), "--source", str(wheel))[0] == 2
        assert run(capsys, "patch", action, "--exo", str(tmp_path), "--no-lock")[0] == 2


def test_the_entry_goes_into_an_existing_sources_table_or_replaces_the_old_one(
    wheel: Path,
) -> None:
    source = uv_project.validate_source(wheel)
    line = source.entry_line()
    table = b"[tool.uv.sources]\nexo-rs = { workspace = true }\n\n[tool.uv]\nx = 1\n"
    added = uv_project.with_source(table, source)
    assert added == b"[tool.uv.sources]\n" + line + table[len(b"[tool.uv.sources]\n") :]
    old = b'[tool.uv.sources]\nexo-orphan-guard = { path = "/old" }\n'
    assert uv_project.with_source(old, source) == b"[tool.uv.sources]\n" + line
    assert uv_project.with_source(b"[project]\n", source) == (
        b"[project]\n\n[tool.uv.sources]\n" + line
    )
    assert uv_project.declared_source(uv_project.with_source(table, source)) == str(wheel)


def _file(path: Path) -> Path:
    path.write_bytes(b"not an archive")
    return path


def _project(path: Path, name: str) -> Path:
    path.mkdir()
    (path / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    return path


def test_the_undo_record_of_a_git_checkout_is_in_its_git_directory_and_git_status_is_clean(
    tmp_path: Path, wheel: Path, no_uv: None, capsys: pytest.CaptureFixture[str], state_home: Path
) -> None:
    tree = exo_tree(tmp_path)
    (tree / "uv.lock").write_bytes(b"version = 1\n")
    git = [GIT, "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "exo"], check=True)
    run(capsys, "patch", "apply", "--exo", str(tree), "--source", str(wheel))
    assert uv_project.undo_path(tree) == tree / ".git" / uv_project.UNDO_NAME
    assert uv_project.undo_path(tree).is_file() and not state_home.exists()
    status = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=all"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    changed = {line[3:] for line in status}
    local = patching.load_series(patching.WITH_PACKAGE_DIR)
    every = [SERIES, *(series for series in local if series.name == SERIES.name)]
    created = {diff.path for series in every for _, diff in series.diffs if diff.old_path is None}
    assert all(line.startswith((" M", "M ")) for line in status if line[3:] not in created), status
    assert changed <= {*(path for series in every for path in series.files), "pyproject.toml"}
    code, out, _ = run(capsys, "patch", "revert", "--exo", str(tree))
    assert code == 0 and out[0] == "source: exo-orphan-guard entry removed"
    assert not uv_project.undo_path(tree).exists()


def test_a_worktree_keeps_its_undo_record_in_the_git_directory_its_git_file_names(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    gitdir = tmp_path / "repo.git" / "worktrees" / "tree"
    gitdir.mkdir(parents=True)
    tree.mkdir()
    (tree / ".git").write_text(f"gitdir: {gitdir}\n")
    assert uv_project.undo_path(tree) == gitdir / uv_project.UNDO_NAME


def test_the_extra_is_added_once_at_the_end_of_its_table_or_in_a_new_one() -> None:
    added = uv_project.with_extra(PYPROJECT)
    assert added.count(b"orphan-guard = ") == 1
    assert uv_project.with_extra(added) == added  # there already: as it is
    bare = b'[project]\nname = "exo"\n'
    assert uv_project.with_extra(bare) == (
        bare + b'\n[project.optional-dependencies]\norphan-guard = ["exo-orphan-guard"]\n'
    )
    quoted = PYPROJECT.replace(b'build = ["nanobind"]', b'"orphan-guard" = ["x"]')
    assert uv_project.with_extra(quoted) == quoted


def test_the_installed_source_is_what_the_installer_recorded_if_it_is_still_there(
    tmp_path: Path,
) -> None:
    """PEP 610's direct_url.json, as `uv tool install ~/src/exo-orphan-guard` writes it:
    the advice names that checkout (issue 42), never a path that is not one."""
    checkout = tmp_path / "src" / "exo-orphan-guard"
    checkout.mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[project]\nname = "exo-orphan-guard"\n')
    wheel = tmp_path / "exo_orphan_guard-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("exo_orphan_guard/__init__.py", "")
    other = tmp_path / "other"
    other.mkdir()

    def recorded(url: str, info: str = '"dir_info": {}') -> str:
        return f'{{"url": "{url}", {info}}}'

    installed_from = uv_project.installed_from
    assert installed_from(recorded(checkout.as_uri())) == checkout
    assert installed_from(recorded(wheel.as_uri(), '"archive_info": {}')) == wheel
    for not_a_source in (
        recorded(other.as_uri()),  # a directory, but not a checkout of the package
        recorded((tmp_path / "gone").as_uri()),
        recorded("https://example.org/exo_orphan_guard-0.1.0-py3-none-any.whl"),
        recorded("git+https://example.org/exo-orphan-guard", '"vcs_info": {}'),
        "not json",
        "[]",
        None,
    ):
        assert installed_from(not_a_source) is None, not_a_source
