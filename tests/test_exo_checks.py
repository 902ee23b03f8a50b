"""The hooks against exo's own checks, on real exo at five versions: ruff check, ruff
format and basedpyright at the versions in exo's uv.lock with exo's config, with the
package installed in exo's environment and without it (the stored series at v1.0.71
and main, the new footprint placed at the anchors elsewhere); `git am` of the stored
series gives `patch apply`'s tree; `git status` after `patch apply` shows only exo's
own files.

Needs EXO_SRC (a git clone of exo) and MLX_LM_SRC (exo's runner environment, so
that every changed file's imports resolve): `make test-exo EXO_SRC=... MLX_LM_SRC=...`.
The tools go into a venv of their own under .cache/exo-tools (pip, once).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.exo import anchors, patching

from .helpers.dist import locked
from .helpers.exo_trees import COMMITS, REPO, SERIES_VERSIONS, exo_src, mlx_lm_src, patch_tree
from .helpers.exo_trees import versions as exo_versions

RUFF = "ruff==0.14.11"
BASEDPYRIGHT = "basedpyright==1.37.1"
"""What exo's uv.lock pins from v1.0.65 to main."""
RUFF_AT = {"v1.0.61": "ruff==0.14.3"}
"""Where exo's uv.lock pins another ruff. v1.0.61 locks no basedpyright (its dev
dependencies leave it out): 1.37.1 checks it too, with v1.0.61's own config."""
GIT = ["git", "-c", "user.name=exo-orphan-guard test", "-c", "user.email=test@invalid"]

pytestmark = [pytest.mark.exo, pytest.mark.skipif(sys.platform != "linux", reason="Linux only")]
all_versions = exo_versions()
versions = exo_versions(SERIES_VERSIONS)


def tool_venv(name: str, *packages: str) -> Path:
    """A venv under .cache/ with `packages`, made once, under a lock: the passes of
    `make test` run side by side and share .cache/. Its bin directory."""
    venv = REPO / ".cache" / name
    marker = venv / f".installed-{'-'.join(packages)}"
    venv.parent.mkdir(exist_ok=True)
    with locked(venv.parent / ".exo-tools.lock"):
        if not marker.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *packages],
                check=True,
            )
            marker.touch()
    return venv / "bin"


@pytest.fixture(scope="session")
def tools() -> Path:
    """exo's ruff and basedpyright (and without exo, no tools)."""
    exo_src()
    return tool_venv("exo-tools", RUFF, BASEDPYRIGHT)


def ruff_at(version: str, tools: Path) -> Path:
    """The ruff exo's uv.lock pins at `version`."""
    if version not in RUFF_AT:
        return tools / "ruff"
    return tool_venv(f"exo-tools-{RUFF_AT[version].replace('==', '-')}", RUFF_AT[version]) / "ruff"


def pristine(root: Path, version: str) -> Path:
    """exo at `version`'s commit, as a git checkout with one commit."""
    tree = root / version
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(exo_src()), "archive", COMMITS[version]],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    subprocess.run([*GIT, "-C", str(tree), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(tree), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(tree), "commit", "-qm", f"exo {version}"], check=True)
    return tree


def files_of(tree: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(tree)): path.read_bytes()
        for path in tree.rglob("*")
        if path.is_file() and ".git" not in path.relative_to(tree).parts
    }


def exo_python(tree: Path, venv_cache: Path) -> Path:
    command = [str(REPO / "scripts" / "exo-venv"), str(tree), str(venv_cache)]
    built = subprocess.run(
        [*command, "--runner", str(mlx_lm_src())],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.fail(f"scripts/exo-venv failed: {built.stderr.strip().splitlines()[-1:]}")
    return Path(built.stdout.strip().splitlines()[-1]) / "bin" / "python"


def basedpyright(
    tools: Path, tree: Path, python: Path, files: list[str], package_path: Path | None
) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if package_path is not None:
        env["PYTHONPATH"] = str(package_path)
    return subprocess.run(
        [str(tools / "basedpyright"), "--pythonpath", str(python), *files],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="session")
def package_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory where `import exo_orphan_guard` finds this checkout (and nothing
    else of it)."""
    path = tmp_path_factory.mktemp("package-path")
    (path / "exo_orphan_guard").symlink_to(REPO / "exo_orphan_guard")
    return path


@all_versions
def test_exos_ruff_and_basedpyright_pass_on_every_file_the_hooks_change(
    version: str, tmp_path: Path, tools: Path, package_path: Path
) -> None:
    tree = pristine(tmp_path, version)
    changed = patch_tree(tree, version, with_package=True)  # both series
    files = [path for path in changed if path.endswith(".py")]
    ruff = ruff_at(version, tools)
    for check in (["check"], ["format", "--check"]):
        checked = subprocess.run(
            [str(ruff), *check, *files], cwd=tree, capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
    cache = Path(os.environ.get("EXO_VENV_CACHE", REPO / ".cache" / "exo-venv"))
    python = exo_python(tree, cache)
    for with_package in (False, True):
        checked = basedpyright(tools, tree, python, files, package_path if with_package else None)
        summary = checked.stdout.strip().splitlines()[-1:]
        assert checked.returncode == 0, f"with package: {with_package}\n{checked.stdout}"
        assert summary == ["0 errors, 0 warnings, 0 notes"], checked.stdout

    # The same checks fail on the worker's call made wrong (spaces ruff format takes
    # out, an argument too many): they can fail.
    main = tree / anchors.WORKER_FILE
    text = main.read_text()
    placed = "        await end_leftover_runners()\n"
    assert placed in text
    main.write_text(text.replace(placed, "        await end_leftover_runners( True )\n"))
    formatted = subprocess.run(
        [str(ruff), "format", "--check", str(main)], cwd=tree, capture_output=True
    )
    assert formatted.returncode != 0
    checked = basedpyright(tools, tree, python, files, package_path)
    assert checked.returncode != 0 and "reportCallIssue" in checked.stdout, checked.stdout
    main.write_text(text)


@versions
def test_git_am_of_the_series_gives_patch_applys_tree_and_git_status_shows_only_exos_files(
    version: str, tmp_path: Path
) -> None:
    by_am = pristine(tmp_path / "am", version)
    patches = patching.patch_files(patching.PATCHES_DIR / version)
    local = patching.patch_files(patching.WITH_PACKAGE_DIR / version)
    for series in (patches, local):  # the PR, then the local series on top
        am = subprocess.run(
            [*GIT, "-C", str(by_am), "am", "-q", *map(str, series)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert am.returncode == 0, am.stdout + am.stderr
    log = subprocess.run(
        ["git", "-C", str(by_am), "log", "--format=%s", f"-{len(patches) + len(local)}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert all(subject.startswith("feature: ") for subject in log), log

    by_apply = pristine(tmp_path / "apply", version)
    from exo_orphan_guard.exo import patch_command

    patch_command.run("apply", by_apply, REPO, lock=False, say=lambda _line: None)
    pyproject = "pyproject.toml"
    applied = files_of(by_apply)
    # patch apply also adds the [tool.uv.sources] entry; git am does not.
    assert {k: v for k, v in files_of(by_am).items() if k != pyproject} == {
        k: v for k, v in applied.items() if k != pyproject
    }
    status = subprocess.run(
        ["git", "-C", str(by_apply), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    series = next(s for s in patching.load_series() if s.name == version)
    with_package = patching.load_series(patching.WITH_PACKAGE_DIR)
    local_series = next(s for s in with_package if s.name == version)
    # --source also writes the extra and its source into pyproject.toml (the series
    # itself no longer names the package: issue 29), and adds the local series.
    changed = {*series.files, *local_series.files, "pyproject.toml"}
    assert {line[3:] for line in status} == changed, status
    assert (by_apply / ".git" / "orphan-guard-undo.json").is_file()
    patch_command.run("revert", by_apply, None, say=lambda _line: None)
    assert (
        subprocess.run(
            ["git", "-C", str(by_apply), "status", "--porcelain", "--untracked-files=all"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        == ""
    )
