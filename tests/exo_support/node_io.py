"""What the stand-in exo nodes (`app_quit_node.py`, `ring_node.py`, `worker_harness.py`)
share: JSON lines on a private stdout, the directories exo reads at import pointed
into a scratch dir, and what exo's main process shows. Imported from beside them (a
script's own directory is first on its path, and a spawned runner is given the same
path); it imports nothing from exo_orphan_guard.

exo's main module imports exo's Rust extension (`exo_rs` on main, `exo_pyo3_bindings`
in the releases), which cannot be built here. A node maps a stand-in under the
extension's file name (`map_exo_extension`), and so do its runners, which re-run the
node's script as `__mp_main__` (as exo's console script is re-run in its runners) and
so import this module: that mapping is the one thing here that runs at import time.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

EXTENSION_ENV = "EOG_EXO_STANDIN_EXTENSION"
"""The stand-in extension a node mapped, for its runners to map too."""

if _mapped_by_the_node := os.environ.get(EXTENSION_ENV):
    ctypes.CDLL(_mapped_by_the_node)

_out: Any = None
_out_lock = threading.Lock()


def emit(**fields: Any) -> None:
    with _out_lock:
        _out.write(json.dumps({"at": time.monotonic(), **fields}) + "\n")
        _out.flush()


def private_stdout() -> None:
    """JSON on a private dup of fd 1; fd 1 itself (inherited by runners) is stderr."""
    global _out
    _out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)


def prepare_env(scratch: Path) -> None:
    (scratch / "resources").mkdir(parents=True, exist_ok=True)
    (scratch / "dashboard").mkdir(parents=True, exist_ok=True)
    (scratch / "dashboard" / "index.html").write_text("<!doctype html>\n")
    for name, sub in (
        ("EXO_RESOURCES_DIR", "resources"),
        ("EXO_DASHBOARD_DIR", "dashboard"),
        ("XDG_CACHE_HOME", "xdg-cache"),
        ("XDG_DATA_HOME", "xdg-data"),
        ("XDG_CONFIG_HOME", "xdg-config"),
        ("EXO_HOME", "exo-home"),
    ):
        os.environ.setdefault(name, str(scratch / sub))


def map_exo_extension(scratch: Path, *, runners: bool = True) -> None:
    """Map a stand-in of exo's Rust extension, named as its file is at this exo (main
    has `supervisor.py`): a copy of one of this interpreter's own extension modules.
    `runners`: theirs too (exo's console script), else only this process's (`python
    -m exo`, whose runners map nothing of exo's)."""
    main = importlib.util.find_spec("exo.worker.runner.supervisor") is not None
    name = "exo_rs" if main else "exo_pyo3_bindings"
    spec = importlib.util.find_spec("_ctypes")
    assert spec is not None and spec.origin is not None
    directory = scratch / "exo-extension" / name
    directory.mkdir(parents=True, exist_ok=True)
    extension = directory / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    shutil.copyfile(spec.origin, extension)
    ctypes.CDLL(str(extension))
    if runners:
        os.environ[EXTENSION_ENV] = str(extension)
