"""A throw-away Python environment that shows what exo's own shows.

The demo and the tests need workers and runners like those of an exo install from
before the guard, without installing exo: a venv whose site-packages holds exo's
dist-info (no exo code), can import this package, and has a stand-in for exo's Rust
extension. What a sweep takes as evidence of exo is that extension mapped into a
process (`sweeper.exo_detect`): the stand-in is a package named as exo main's
(`exo_rs`) whose import maps a real shared object under the extension's file name.
A stand-in worker calls `as_exo_main(__name__)` at the top of its main module, as
exo's main module imports the extension: its runners then map it too (multiprocessing
re-runs the main module in each), as the runners of exo's console script and frozen
app do, unless `STARTED_AS_ENV` says `module` (`python -m exo`, whose runners show
nothing of exo's).
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.machinery
import importlib.util
import os
import shutil
import site
import sys
import sysconfig
from pathlib import Path
from typing import Final

EXTENSION_MODULE: Final = "exo_rs"
STARTED_AS_ENV: Final = "EOG_STAND_IN_EXO_STARTED_AS"
"""`module`: only the stand-in worker maps the extension, as `python -m exo` does
(multiprocessing never re-runs a `__main__` module in a runner); else its runners do
too, as those of exo's console script and of the frozen app."""
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]
_EXTENSION_INIT: Final = f'''"""Stand-in for exo's Rust extension (exo-orphan-guard's rig):
a real shared object mapped under the extension's file name, all a sweep sees of it."""

import ctypes
import importlib.machinery
import os

ctypes.CDLL(
    os.path.join(
        os.path.dirname(__file__),
        "{EXTENSION_MODULE}" + importlib.machinery.EXTENSION_SUFFIXES[0],
    )
)
'''


def make_exo_environment(root: Path) -> str:
    """Create the environment at `root`; returns the path of its `python`."""
    import venv  # here: every stand-in worker and runner imports this module

    venv.EnvBuilder(with_pip=False, symlinks=sys.platform != "win32").create(root)
    relative = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    site_packages = root / relative
    dist_info = site_packages / "exo-0.0.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: exo\nVersion: 0.0.0\n")
    add_extension(site_packages)
    # This package and its dependencies (mlx included) come from the running environment.
    ours = [*site.getsitepackages(), str(_PACKAGE_PARENT)]
    lines = [f"import site; site.addsitedir({path!r})" for path in ours]
    (site_packages / "zz-exo-orphan-guard.pth").write_text("\n".join(lines) + "\n")
    return str(root / "bin" / "python")


def add_extension(directory: Path) -> Path:
    """The stand-in extension package in `directory` (a site-packages); its path."""
    package = directory / EXTENSION_MODULE
    package.mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    shutil.copyfile(a_shared_object(), package / f"{EXTENSION_MODULE}{suffix}")
    (package / "__init__.py").write_text(_EXTENSION_INIT)
    return package


def a_shared_object() -> str:
    """A real shared object of this interpreter's to copy: one of its own extension
    modules (`_ctypes`, which loading the copy needs anyway)."""
    spec = importlib.util.find_spec("_ctypes")
    if spec is not None and spec.origin is not None and os.path.isfile(spec.origin):
        return spec.origin
    pattern = os.path.join(glob.escape(sysconfig.get_path("platstdlib")), "lib-dynload", "*.so")
    found = sorted(glob.glob(pattern))
    if not found:
        raise RuntimeError("this Python has no shared object to stand in for exo's extension")
    return found[0]


def as_exo_main(name: str) -> None:
    """At the top of a stand-in worker's main module (`name`: its `__name__`): map the
    extension where the environment has it, as exo's main module does."""
    if name != "__main__" and os.environ.get(STARTED_AS_ENV) == "module":
        return
    with contextlib.suppress(ImportError):
        importlib.import_module(EXTENSION_MODULE)
