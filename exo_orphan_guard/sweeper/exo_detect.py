"""What shows that a process runs exo: evidence, never resemblance.

A runner's command line only says `python -c ... --multiprocessing-fork`, as the
spawn children of every Python program do; an interpreter from an environment that
has exo installed runs notebooks, `mlx_lm` and scripts as well as exo. What only exo
shows:

- exo's Rust extension mapped: `exo_rs` (exo main), `exo_pyo3_bindings` (every
  release v1.0.61 to v1.0.71). exo's main module imports it (`exo.main` directly on
  main, through `exo.routing.router` in the releases), so exo's main process maps it
  however it was started. A runner maps it when its spawner's `__main__` was exo's
  console script (multiprocessing re-runs a `__main__` started from a path as
  `__mp_main__`, which imports `exo.main`) or the frozen app (whose entry imports
  `exo.main` before `freeze_support()` hands over to the runner); a runner of
  `python -m exo` does not (`__main__` modules are never re-run), nor does anything
  exo's runner itself imports.
- the frozen app: an executable named `exo` beside the `_internal` directory of a
  PyInstaller onedir build that bundles that extension (EXO.app runs
  `Contents/Resources/exo/exo`, and its runners are the same executable).
- for a live process, its command line running exo: `<prefix>/bin/exo` (exo's
  console script) or `python -m exo`, from an environment that has exo installed.

`in_environment` is the old resemblance, kept only to list what it no longer ends: a
spawn child of an interpreter whose environment has exo installed (argv[0] names the
environment: a venv's `python` is a symlink, so /proc/<pid>/exe and psutil's `exe()`
only show the base interpreter), or of any absolute binary named `exo`.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Final

FROZEN_EXECUTABLE_NAME: Final = "exo"
"""exo's PyInstaller build (packaging/pyinstaller/exo.spec) names its binary `exo`; the
macOS app runs it from `EXO.app/Contents/Resources/exo/exo`."""
FROZEN_CONTENTS: Final = "_internal"
"""PyInstaller 6's onedir contents directory (exo's lock pins PyInstaller 6.17)."""
EXTENSION_MODULES: Final = ("exo_rs", "exo_pyo3_bindings")
_EXTENSION_FILE: Final = re.compile(rf"(?:{'|'.join(EXTENSION_MODULES)})\.[^/]*so")
"""`exo_rs.cpython-313-darwin.so`, `exo_pyo3_bindings.abi3.so`: a CPython extension
module's file name on macOS and Linux alike."""
_MODULE_NAMES: Final = frozenset({"exo", "exo.main"})
_OPTIONS_WITH_A_VALUE: Final = frozenset({"-X", "-W", "--check-hash-based-pycs"})


def exo_extension(paths: Iterable[str]) -> str | None:
    """The path of exo's Rust extension among mapped `paths`, or None."""
    return next((path for path in paths if is_exo_extension(path)), None)


def is_exo_extension(path: str) -> bool:
    return _EXTENSION_FILE.fullmatch(os.path.basename(path)) is not None


class ExoExecutables:
    """Answers about executables and environments, each looked up on disk once per
    instance (a snapshot's worth)."""

    def __init__(self) -> None:
        self._frozen: dict[str, bool] = {}
        self._environments: dict[str, bool] = {}

    def evidence(
        self,
        argv: Sequence[str],
        exe: str | None,
        mapped: Callable[[], frozenset[str] | None],
        *,
        alive_parent: bool,
    ) -> str | None:
        """What shows that the process runs exo, in words, or None. `mapped` reads its
        mapped files (asked last: the costliest); `alive_parent`: its command line
        counts too (exo's main process, seen alive; a runner's says nothing)."""
        frozen = next((path for path in (exe, *argv[:1]) if path and self.frozen(path)), None)
        if frozen is not None:
            return f"runs exo's frozen app {frozen}"
        if alive_parent and self.runs_exo_command(argv):
            return f"runs exo: {' '.join(argv[:3])}"
        found = exo_extension(mapped() or ())
        return None if found is None else f"maps exo's extension {os.path.basename(found)}"

    def frozen(self, path: str) -> bool:
        if path not in self._frozen:
            self._frozen[path] = is_frozen_exo(path)
        return self._frozen[path]

    def in_environment(self, argv: Sequence[str], exe: str | None) -> bool:
        """The old resemblance (see the module's docstring)."""
        for path in (argv[0] if argv else None, exe):
            if not path or not os.path.isabs(path):
                continue
            name = os.path.basename(path)
            if name == FROZEN_EXECUTABLE_NAME or (
                name.startswith("python") and self.has_exo(_prefix_of(path))
            ):
                return True
        return False

    def runs_exo_command(self, argv: Sequence[str]) -> bool:
        """exo's console script, or `-m exo`, run by an interpreter."""
        if len(argv) < 2 or not os.path.basename(argv[0]).startswith("python"):
            return False
        index = 1
        while index < len(argv) and argv[index].startswith("-") and argv[index] != "-m":
            index += 2 if argv[index] in _OPTIONS_WITH_A_VALUE else 1
        if index >= len(argv):
            return False
        if argv[index] == "-m":
            module = argv[index + 1] if index + 1 < len(argv) else ""
            return (
                module in _MODULE_NAMES
                and os.path.isabs(argv[0])
                and self.has_exo(_prefix_of(argv[0]))
            )
        script = argv[index]
        return (
            os.path.isabs(script)
            and os.path.basename(script) == FROZEN_EXECUTABLE_NAME
            and os.path.basename(os.path.dirname(script)) == "bin"
            and self.has_exo(_prefix_of(script))
        )

    def has_exo(self, prefix: str) -> bool:
        if prefix not in self._environments:
            self._environments[prefix] = environment_has_exo(prefix)
        return self._environments[prefix]


def is_frozen_exo(path: str) -> bool:
    """An absolute path named `exo` beside a PyInstaller contents directory holding
    exo's extension (at its top, or in its package directory)."""
    if not os.path.isabs(path) or os.path.basename(path) != FROZEN_EXECUTABLE_NAME:
        return False
    contents = glob.escape(os.path.join(os.path.dirname(path), FROZEN_CONTENTS))
    found = [
        *glob.glob(os.path.join(contents, "exo*.so")),
        *glob.glob(os.path.join(contents, "exo*", "exo*.so")),
    ]
    return any(is_exo_extension(file) for file in found)


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


def _prefix_of(path: str) -> str:
    """`<prefix>` of `<prefix>/bin/<name>`."""
    return os.path.dirname(os.path.dirname(path))
