"""exo's shared/constants.py, as much as the in-tree hooks module reads: the toggle
(the line the series appends) and the cache directory, found as exo finds them."""

import os
import sys
from pathlib import Path

_EXO_HOME_ENV = os.environ.get("EXO_HOME", None)


def _get_xdg_dir(env_var: str, fallback: str) -> Path:
    if _EXO_HOME_ENV is not None:
        return Path.home() / _EXO_HOME_ENV
    if sys.platform != "linux":
        return Path.home() / ".exo"
    xdg_value = os.environ.get(env_var, None)
    if xdg_value is not None:
        return Path(xdg_value) / "exo"
    return Path.home() / fallback / "exo"


EXO_CACHE_HOME = _get_xdg_dir("XDG_CACHE_HOME", ".cache")

EXO_ORPHAN_GUARD = os.getenv("EXO_ORPHAN_GUARD", "false").lower() in ("true", "1")
