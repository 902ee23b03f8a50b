"""What the stand-in exo nodes (`app_quit_node.py`, `ring_node.py`) share: JSON lines on
a private stdout, and the directories exo reads at import pointed into a scratch dir.
Imported from beside them (a script's own directory is first on its path, and a
spawned runner is given the same path); it imports nothing from exo_orphan_guard."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

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
