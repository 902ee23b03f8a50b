"""The package ships: its wheel and sdist (as `make dist` builds them) carry what an
operator needs, and the wheel alone, in a clean venv beside exo's locked psutil,
passes `exo-orphan-guard selftest`."""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from exo_orphan_guard._version import __version__
from exo_orphan_guard.exo import bugfix, patching, placement

from .helpers.cli import run_cli
from .helpers.dist import ROOT, UV, Dist, built_dist, wheelhouse
from .test_exo_uv_install import REQUIREMENTS

EXO_LOCKED_PSUTIL = "7.2.1"


@pytest.fixture(scope="module")
def dist() -> Dist:
    return built_dist()


def test_one_version_everywhere(dist: Dist) -> None:
    assert dist.wheel.name == f"exo_orphan_guard-{__version__}-py3-none-any.whl"
    assert dist.sdist.name == f"exo_orphan_guard-{__version__}.tar.gz"
    assert f"## {__version__}" in (ROOT / "CHANGELOG.md").read_text()
    version = run_cli("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout == f"exo-orphan-guard {__version__}\n"


def test_the_wheel_carries_metadata_patches_and_entry_points(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        info = f"exo_orphan_guard-{__version__}.dist-info"
        metadata = email.parser.Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert metadata["Name"] == "exo-orphan-guard"
    assert metadata["Version"] == __version__
    assert metadata["License-Expression"] == "Apache-2.0"
    runtime = [
        requirement
        for requirement in metadata.get_all("Requires-Dist", [])
        if "extra ==" not in requirement
    ]
    assert sorted(runtime) == ["anyio>=4.4", "loguru>=0.7", "psutil>=7.2.1"]
    assert "exo-orphan-guard = exo_orphan_guard.tools.cli:entry_point" in entry_points
    assert "exo_orphan_guard/py.typed" in names
    for series in [*patching.load_series(), *patching.load_series(patching.WITH_PACKAGE_DIR)]:
        assert series.directory is not None
        directory = series.directory.relative_to(patching.PATCHES_DIR.parents[2]).as_posix()
        for patch_name, _ in series.diffs:
            assert f"{directory}/{patch_name}" in names
        if series.directory.parent == patching.PATCHES_DIR:  # the PR's, not the local one
            assert f"{directory}/{patching.COVER_LETTER}" in names
    for version in bugfix.VERSIONS:  # the separate bugfix series
        stored = bugfix.patches(version)
        assert stored, version
        for patch in stored:
            assert f"exo_orphan_guard/exo/patches/bugfix/{version}/{patch.name}" in names
    for footprint in (placement.WORK_QUEUE, placement.RELAY, placement.WITH_PACKAGE):
        root = footprint.root.relative_to(patching.PATCHES_DIR.parents[2]).as_posix()
        for path in placement.new_files(footprint):  # what the series add to exo's tree
            assert f"{root}/{path}" in names


def test_the_sdist_builds_the_same_package(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "exo_orphan_guard/_version.py"} <= names
    assert f"exo_orphan_guard/exo/patches/main/{patching.PATCH_NAMES[2]}" in names
    assert "exo_orphan_guard/exo/exo_tree/src/exo/worker/runner/parent_watch.py" in names
    assert "exo_orphan_guard/exo/exo_tree_with_package/src/exo/worker/orphan_guard.py" in names


def test_the_wheel_installs_into_a_clean_venv_and_passes_its_selftest(
    tmp_path: Path, dist: Dist
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, venv], check=True)
    bin_dir = venv / "bin"
    subprocess.run(
        [
            UV,
            "pip",
            "install",
            "-q",
            "--python",
            bin_dir / "python",
            dist.wheel,
            f"psutil=={EXO_LOCKED_PSUTIL}",  # exo's lock: the floor must fit it
        ],
        check=True,
        capture_output=True,
    )
    where = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import exo_orphan_guard, psutil; print(exo_orphan_guard.__file__, psutil.__version__)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    module_file, psutil_version = where.stdout.split()
    assert Path(module_file).is_relative_to(venv) and psutil_version == EXO_LOCKED_PSUTIL

    selftest = subprocess.run(
        [str(bin_dir / "exo-orphan-guard"), "selftest", "--strategy", "auto"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr
    assert "PASS: every strategy did what it is designed to do." in selftest.stdout


def test_make_dist_sets_up_only_build_and_twine(tmp_path: Path) -> None:
    """`make dist` (issue 42): none of the test or dev environment, no system package.
    What it would run where nothing is set up, then its build run for real, from a
    dist venv that has build and twine (this one's), offline: the build back-end
    comes from a local directory of distributions."""
    dist_venv, out = tmp_path / "dist-venv", tmp_path / "dist"
    where = [f"VENV={tmp_path / 'no-venv'}", f"DIST_VENV={dist_venv}", f"DIST_DIR={out}"]
    planned = subprocess.run(
        ["make", "--no-print-directory", "-n", "dist", *where],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installs = [line for line in planned.splitlines() if "pip install" in line]
    assert installs == [
        f"{dist_venv}/bin/python -m pip install -q --disable-pip-version-check build twine"
    ], planned
    for unwanted in ("no-venv", "ensure-test-packages", "apt-get", ".[test"):
        assert unwanted not in planned, planned

    bin_dir = dist_venv / "bin"
    bin_dir.mkdir(parents=True)
    for name, target in (
        ("python", sys.executable),
        ("twine", Path(sys.executable).parent / "twine"),
    ):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (bin_dir / name).chmod(0o755)
    (bin_dir / ".installed").touch()
    offline = {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse("uv-wheelhouse", REQUIREMENTS)),
    }
    built = subprocess.run(
        ["make", "--no-print-directory", "dist", *where],
        cwd=ROOT,
        env={**os.environ, **offline},
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert sorted(path.name for path in out.iterdir()) == [
        f"exo_orphan_guard-{__version__}-py3-none-any.whl",
        f"exo_orphan_guard-{__version__}.tar.gz",
    ]
