"""The frozen stand-in app: PyInstaller onedir binary `exo`, built from this package's
wheel in a clean venv (an editable install is not bundled), cached under .cache/. It
bundles the stand-in of exo's Rust extension (`rig.stand_in_exo`) where PyInstaller
puts exo's, `_internal/exo_rs/`, and its entry imports it as exo's does.

It is frozen with Python 3.13, what EXO.app bundles, wherever this machine has one
(`EOG_PYTHON313`, which `make test` sets), whichever interpreter runs the tests: the
binary carries its own, so the 3.11 and 3.13 passes test one build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from exo_orphan_guard.rig.stand_in_exo import EXTENSION_MODULE

from .dist import ROOT, UV, built_dist, cached, digest_of

APP_SCRIPT = ROOT / "tests" / "frozen_app" / "exo_standin.py"
PYINSTALLER = "pyinstaller>=6.10"
PYTHON313_ENV = "EOG_PYTHON313"
_ADD_EXTENSION = (
    "import sys; from pathlib import Path; "
    "from exo_orphan_guard.rig.stand_in_exo import EXTENSION_MODULE, add_extension; "
    "print(next(add_extension(Path(sys.argv[1])).glob(EXTENSION_MODULE + '.*')))"
)
"""Run by the build venv's interpreter: the stand-in extension is one of its own."""


def _builder() -> str:
    """Python 3.13 if this machine has one, else this interpreter."""
    named = os.environ.get(PYTHON313_ENV, "")
    return named if named and os.access(named, os.X_OK) else sys.executable


def frozen_app() -> Path:
    """The path of the frozen `exo` binary."""
    wheel = built_dist().wheel
    builder = _builder()
    version = subprocess.run(
        [builder, "-c", "import sys; print(sys.version)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    key = digest_of([APP_SCRIPT, wheel], PYINSTALLER, version)

    def build(target: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="eog-frozen-") as scratch:
            work = Path(scratch)
            venv = work / "venv"
            subprocess.run([UV, "venv", "-q", "--python", builder, venv], check=True)
            python = str(venv / "bin" / "python")
            subprocess.run(
                [UV, "pip", "install", "-q", "--python", python, wheel, PYINSTALLER],
                check=True,
                capture_output=True,
            )
            script = work / "exo.py"
            shutil.copyfile(APP_SCRIPT, script)
            (packages,) = venv.glob("lib/python3*/site-packages")
            extension = subprocess.run(
                [python, "-c", _ADD_EXTENSION, str(packages)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            built = subprocess.run(
                [
                    python,
                    "-m",
                    "PyInstaller",
                    "--noconfirm",
                    "--onedir",
                    "--name",
                    "exo",
                    "--distpath",
                    str(work / "dist"),
                    "--workpath",
                    str(work / "build"),
                    "--specpath",
                    str(work),
                    "--hidden-import",
                    EXTENSION_MODULE,
                    "--add-binary",
                    f"{extension}{os.pathsep}{EXTENSION_MODULE}",
                    str(script),
                ],
                capture_output=True,
                text=True,
            )
            if built.returncode != 0:
                raise RuntimeError(f"PyInstaller failed: {built.stderr[-2000:]}")
            shutil.copytree(work / "dist" / "exo", target / "exo", symlinks=True)

    return cached(f"frozen-app-{key}", build) / "exo" / "exo"
