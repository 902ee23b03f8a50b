"""Is this executable exo's? The frozen app, or a Python whose environment has exo.

A runner's command line only says `python -c ... --multiprocessing-fork`; many Python
programs have such children. What makes one exo's is the interpreter it runs: argv[0]
names the environment (a venv's `python` is a symlink, so /proc/<pid>/exe and psutil's
`exe()` only show the base interpreter), and that environment has exo installed.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Final

FROZEN_EXECUTABLE_NAME: Final = "exo"
"""exo's PyInstaller build (packaging/pyinstaller/exo.spec) names its binary `exo`; the
macOS app runs it from `EXO.app/Contents/Resources/exo/exo`."""


class ExoExecutables:
    """Answers per executable path, each looked up on disk once per instance."""

    def __init__(self) -> None:
        self._known: dict[str, bool] = {}

    def recognises(self, argv: Sequence[str], exe: str | None) -> bool:
        paths = [path for path in (argv[0] if argv else None, exe) if path]
        return any(self._is_exo(path) for path in paths)

    def _is_exo(self, path: str) -> bool:
        if path not in self._known:
            self._known[path] = is_exo_executable(path)
        return self._known[path]


def is_exo_executable(path: str) -> bool:
    name = os.path.basename(path)
    if name == FROZEN_EXECUTABLE_NAME:
        return os.path.isabs(path)
    if not name.startswith("python") or not os.path.isabs(path):
        return False
    return environment_has_exo(os.path.dirname(os.path.dirname(path)))


def environment_has_exo(prefix: str) -> bool:
    """exo's dist-info (regular or editable install) or package in site-packages."""
    for site_packages in glob.glob(
        os.path.join(glob.escape(prefix), "lib", "python3*", "site-packages")
    ):
        if glob.glob(os.path.join(glob.escape(site_packages), "exo-[0-9]*.dist-info")):
            return True
        if os.path.isfile(os.path.join(site_packages, "exo", "__init__.py")):
            return True
    return False
