"""PyInstaller finds this package's hook here (entry point `pyinstaller40`).

exo's app is a PyInstaller build. The package loads its modules on first use
(`exo_orphan_guard.__getattr__`), which import analysis cannot follow; the hook names
them, so a build environment with the package installed bundles all of it.
"""

from __future__ import annotations

from pathlib import Path


def hook_dirs() -> list[str]:
    return [str(Path(__file__).resolve().parent)]
