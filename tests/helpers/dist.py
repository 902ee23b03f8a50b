"""Built artefacts that several tests share, cached under .cache/ and keyed on what
goes into them, so a second run (or the Python 3.13 suite) reuses them."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache"
PACKAGE_INPUTS = ("pyproject.toml", "README.md", "exo_orphan_guard")
UV = Path(sys.executable).parent / "uv"
"""The test venv's uv (a test requirement)."""


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


def digest_of(paths: Iterable[Path], *extra: str) -> str:
    """Of the files' relative names and bytes (directories walked), and `extra`."""
    hasher = hashlib.sha256()
    for word in extra:
        hasher.update(word.encode() + b"\0")
    for top in paths:
        files = sorted(top.rglob("*")) if top.is_dir() else [top]
        for path in files:
            if path.is_file() and "__pycache__" not in path.parts:
                hasher.update(str(path.relative_to(ROOT)).encode() + b"\0")
                hasher.update(path.read_bytes() + b"\0")
    return hasher.hexdigest()[:16]


def built_dist() -> Dist:
    """This checkout's wheel and sdist, built by `python -m build` (as `make dist`, with
    uv making its isolated build environments: pip took twice the CPU)."""
    key = digest_of([ROOT / name for name in PACKAGE_INPUTS])

    def build(target: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "build",
                "--installer",
                "uv",
                "--outdir",
                str(target),
                str(ROOT),
            ],
            env={**os.environ, "PATH": f"{UV.parent}{os.pathsep}{os.environ.get('PATH', '')}"},
            check=True,
            capture_output=True,
        )

    directory = cached(f"dist-{key}", build)
    (wheel,) = directory.glob("exo_orphan_guard-*.whl")
    (sdist,) = directory.glob("exo_orphan_guard-*.tar.gz")
    return Dist(wheel, sdist)


def wheelhouse(name: str, requirements: Iterable[str]) -> Path:
    """A directory of distributions (`pip download`, no dependencies resolved): a
    package index for tests that must run uv offline. One pip run for each set of
    options: a pip run per requirement cost 26 s of CPU, mostly pip starting."""
    wanted = sorted(requirements)
    by_options: dict[str, list[str]] = {}
    for requirement in wanted:
        options, _, spec = requirement.rpartition(" ")
        by_options.setdefault(options, []).append(spec)

    def download(target: Path) -> None:
        for options, specs in by_options.items():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "-d",
                    str(target),
                    *options.split(),
                    *specs,
                ],
                check=True,
                capture_output=True,
            )

    return cached(f"{name}-{digest_of([], *wanted)}", download)


def cached(name: str, make: Callable[[Path], None]) -> Path:
    """CACHE/name, made once by `make` (into a scratch directory, then renamed)."""
    target = CACHE / name
    CACHE.mkdir(exist_ok=True)
    with locked(CACHE / f".{name}.lock"):
        if target.is_dir():
            return target
        scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CACHE))
        try:
            make(scratch)
            scratch.chmod(0o755)  # mkdtemp's 0700 would hide it from other users' tests
            os.replace(scratch, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


@contextlib.contextmanager
def locked(path: Path) -> Generator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
