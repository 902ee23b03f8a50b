"""The real install path into a uv project shaped like exo's, offline.

A workspace with a member, extras, `[tool.uv.sources]`, `environments` for macOS and
Linux like exo's, and a `uv.lock` made by uv before the patch; exo's source files are
rebuilt from the series' pre-image lines. The series adds no extra, so a patched
tree still locks and syncs with the package on no index, and `uv run --with <wheel>`
adds it without any edit (issue 29). `patch apply --source` must leave a tree that
`uv sync --locked --extra orphan-guard` installs, with psutil kept at exo's locked
7.2.1; revert must give back both files byte for byte. uv reads only a local
directory of distributions: no index, no network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest

from exo_orphan_guard._version import __version__
from exo_orphan_guard.exo import patching, uv_project

from .helpers.cli import run_cli
from .helpers.dist import UV, Dist, built_dist, wheelhouse
from .test_patching import build_tree, snapshot

SERIES = next(s for s in patching.load_series() if s.name == "v1.0.71")

EXO_LIKE_PYPROJECT = """\
[project]
name = "exo"
version = "0.3.70"
requires-python = ">=3.11"
dependencies = [
  "psutil>=7.0.0",
  "anyio==4.11.0",
  "loguru>=0.7.3",
  "exo-rs",
]

[project.optional-dependencies]
build = ["nanobind"]
cpu = [
  "mlx==0.31.1; sys_platform == 'linux'",
  "mlx-cpu==0.31.1; sys_platform == 'linux'",
]

[tool.uv.workspace]
members = ["rust/exo_rs"]

[tool.uv.sources]
exo-rs = { workspace = true }

[build-system]
requires = ["uv_build>=0.8.9,<0.9.0"]
build-backend = "uv_build"

[tool.uv]
environments = ["sys_platform == 'darwin'", "sys_platform == 'linux'"]
"""

MEMBER_PYPROJECT = """\
[project]
name = "exo-rs"
version = "0.1.0"
requires-python = ">=3.11"

[build-system]
requires = ["uv_build>=0.8.9,<0.9.0"]
build-backend = "uv_build"
"""

# What the project, the package and their builds need: exo's locked psutil (with its
# sdist, so the macOS half of the universal lock resolves), the package's own
# dependencies, both build back-ends, and the Linux wheels of the `cpu` extra.
REQUIREMENTS = (
    "psutil==7.2.1",
    "--no-binary :all: psutil==7.2.1",
    "anyio==4.11.0",
    "idna==3.10",
    "sniffio==1.3.1",
    "typing_extensions==4.15.0",
    "loguru==0.7.3",
    "nanobind==2.9.2",
    "uv_build==0.8.24",
    "setuptools==80.9.0",
    "--only-binary :all: --python-version 3.11 mlx==0.31.1",
    "--only-binary :all: --python-version 3.13 mlx==0.31.1",
    "mlx-cpu==0.31.1",
)


@pytest.fixture(scope="module")
def dist() -> Dist:
    return built_dist()


@pytest.fixture(scope="module")
def uv_environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if not UV.exists():
        pytest.fail(f"uv is a test dependency but {UV} is missing: make setup")
    index = wheelhouse("uv-wheelhouse", REQUIREMENTS)
    environment = dict(os.environ)
    environment.update(
        PATH=f"{UV.parent}{os.pathsep}{environment.get('PATH', '')}",
        UV_OFFLINE="1",
        UV_NO_INDEX="1",
        UV_FIND_LINKS=str(index),
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(tmp_path_factory.mktemp("uv-cache")),
        UV_PYTHON=os.path.realpath(sys.executable),
        UV_PYTHON_DOWNLOADS="never",
    )
    environment.pop("VIRTUAL_ENV", None)
    environment["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))  # undo records
    return environment


def exo_like_project(root: Path, environment: Mapping[str, str]) -> Path:
    tree = root / "exo"
    tree.mkdir()
    build_tree(tree, SERIES)
    (tree / "pyproject.toml").write_text(EXO_LIKE_PYPROJECT)
    (tree / "src" / "exo" / "__init__.py").write_text("")
    member = tree / "rust" / "exo_rs"
    (member / "src" / "exo_rs").mkdir(parents=True)
    (member / "pyproject.toml").write_text(MEMBER_PYPROJECT)
    (member / "src" / "exo_rs" / "__init__.py").write_text("")
    uv(tree, environment, "lock")
    return tree


def uv(tree: Path, environment: Mapping[str, str], *arguments: str) -> str:
    finished = subprocess.run(
        [str(UV), *arguments], cwd=tree, env=environment, capture_output=True, text=True
    )
    assert finished.returncode == 0, f"uv {' '.join(arguments)}: {finished.stderr}"
    return finished.stdout + finished.stderr


def cli(environment: Mapping[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*arguments, env=environment, timeout=600)


def locked_versions(tree: Path) -> dict[str, str]:
    lock = tomllib.loads((tree / "uv.lock").read_text())
    packages: list[dict[str, str]] = lock["package"]
    return {package["name"]: package.get("version", "") for package in packages}


def checkout_from(sdist: Path, root: Path) -> Path:
    with tarfile.open(sdist) as archive:
        archive.extractall(root, filter="data")
    (checkout,) = root.glob("exo_orphan_guard-*")
    return checkout


@pytest.mark.parametrize("kind", ["wheel", "sdist", "checkout"])
def test_patched_exo_like_project_locks_syncs_and_imports_the_guard_offline(
    tmp_path: Path, dist: Dist, uv_environment: dict[str, str], kind: str
) -> None:
    tree = exo_like_project(tmp_path, uv_environment)
    before = snapshot(tree)
    assert locked_versions(tree)["psutil"] == "7.2.1"
    source = {
        "wheel": dist.wheel,
        "sdist": dist.sdist,
        "checkout": checkout_from(dist.sdist, tmp_path / "checkout"),
    }[kind]

    applied = cli(uv_environment, "patch", "apply", "--exo", str(tree), "--source", str(source))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    lines = applied.stdout.splitlines()
    # --source brings the package, so the local series goes on top of the PR.
    assert lines[1] == "local series v1.0.71 (the package's part inside exo): applied"
    assert lines[2] == f"source: {source} ({kind}), with the orphan-guard extra"
    # uv locks a checkout's dynamic version as such; built artefacts carry theirs.
    locked_as = "(dynamic)" if kind == "checkout" else f"v{__version__}"
    assert lines[3] == f"uv.lock: locked (Added exo-orphan-guard {locked_as})"
    assert len(lines) == 4
    versions = locked_versions(tree)
    assert versions["exo-orphan-guard"] == ("" if kind == "checkout" else __version__)
    assert versions["psutil"] == "7.2.1"  # exo's lock keeps its psutil
    assert versions["anyio"] == "4.11.0"

    checked = cli(uv_environment, "patch", "check", "--exo", str(tree))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    _, _, source_line, lock_line, undo_line = checked.stdout.splitlines()
    assert source_line == f"source: {source}"
    assert lock_line.startswith("uv.lock: current (Resolved ")
    assert undo_line.startswith("undo record: ")

    # exo's app build step, as the series patches it.
    uv(tree, uv_environment, "sync", "--locked", "--extra", "orphan-guard")
    python = tree / ".venv" / "bin" / "python"
    imported = subprocess.run(
        [
            str(python),
            "-c",
            "import exo_orphan_guard as guard, psutil; "
            "print(guard.__version__, psutil.__version__, guard.sweep.__module__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.split() == [__version__, "7.2.1", "exo_orphan_guard.sweeper.sweeping"]
    version = subprocess.run(
        [str(tree / ".venv" / "bin" / "exo-orphan-guard"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == f"exo-orphan-guard {__version__}"

    reverted = cli(uv_environment, "patch", "revert", "--exo", str(tree))
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert "uv.lock: restored as it was before apply" in reverted.stdout
    after = {
        name: content for name, content in snapshot(tree).items() if not name.startswith(".venv/")
    }
    assert after == before
    uv(tree, uv_environment, "lock", "--check")


def test_without_a_source_the_patched_tree_still_locks_syncs_and_runs_with_the_wheel(
    tmp_path: Path, dist: Dist, uv_environment: dict[str, str]
) -> None:
    """Issue 29, item 1: no state of the series breaks exo's lock."""
    tree = exo_like_project(tmp_path, uv_environment)
    before = snapshot(tree)
    applied = cli(uv_environment, "patch", "apply", "--exo", str(tree))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    series, local, source, lock = applied.stdout.splitlines()
    assert series.startswith(f"series v1.0.71 ({len(SERIES.files)} files) applied")
    assert local.startswith("local series: not applied")
    assert "uv run --with " in source
    assert f"exo-orphan-guard patch apply --exo {tree} --source " in source
    assert lock == "uv.lock: nothing to lock (pyproject.toml is unchanged)"
    assert (tree / "pyproject.toml").read_bytes() == before["pyproject.toml"]
    assert (tree / "uv.lock").read_bytes() == before["uv.lock"]
    uv(tree, uv_environment, "lock", "--check")  # the lock is current, package or not
    uv(tree, uv_environment, "sync", "--locked")  # exo's app build step, as it is
    checked = cli(uv_environment, "patch", "check", "--exo", str(tree))
    assert checked.stdout.splitlines()[3].startswith("uv.lock: current")
    # The no-edit way: uv adds the package to this run only.
    ran = uv(
        tree,
        uv_environment,
        "run",
        "--with",
        str(dist.wheel),
        "python",
        "-c",
        "import exo_orphan_guard.exo.hooks as hooks, exo_orphan_guard; "
        "print(exo_orphan_guard.__version__, hooks.__name__)",
    )
    assert f"{__version__} exo_orphan_guard.exo.hooks" in ran
    assert (tree / "uv.lock").read_bytes() == before["uv.lock"]

    reverted = cli(uv_environment, "patch", "revert", "--exo", str(tree))
    assert reverted.returncode == 0
    after = {name: data for name, data in snapshot(tree).items() if not name.startswith(".venv/")}
    assert after == before


def test_a_lock_changed_after_apply_is_left_alone_by_revert(
    tmp_path: Path, dist: Dist, uv_environment: dict[str, str]
) -> None:
    tree = exo_like_project(tmp_path, uv_environment)
    original_pyproject = (tree / "pyproject.toml").read_bytes()
    applied = cli(uv_environment, "patch", "apply", "--exo", str(tree), "--source", str(dist.wheel))
    assert applied.returncode == 0
    edited = (tree / "uv.lock").read_bytes() + b"\n# the operator's own edit\n"
    (tree / "uv.lock").write_bytes(edited)
    reverted = cli(uv_environment, "patch", "revert", "--exo", str(tree))
    assert reverted.returncode == 0
    assert (
        f"uv.lock: changed after apply, left as it is: run: cd {tree} && uv lock" in reverted.stdout
    )
    assert (tree / "uv.lock").read_bytes() == edited
    assert (tree / "pyproject.toml").read_bytes() == original_pyproject
    assert not uv_project.undo_path(tree).exists()
