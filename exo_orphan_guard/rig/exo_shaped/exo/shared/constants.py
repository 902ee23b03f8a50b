"""exo's shared/constants.py, as much as the series' modules read: the cache directory,
found as exo finds them, and the settings (the lines the PR appends)."""

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

# With EXO_ORPHAN_GUARD on, a runner whose worker dies takes exo's own Shutdown, and the
# worker's start-up sweep ends the recorded runners a dead exo left behind.
# "true" as exo's other toggles, or "1"
EXO_ORPHAN_GUARD = os.getenv("EXO_ORPHAN_GUARD", "false").lower() in ("true", "1")
EXO_RUNNER_RECORDS_DIR = EXO_CACHE_HOME / "runners"
# The start-up sweep's bounds for each leftover runner, ended side by side
LEFTOVER_RUNNER_RESUME_SECONDS = 1.0
LEFTOVER_RUNNER_INTERRUPT_SECONDS = 10.0
LEFTOVER_RUNNER_KILL_SECONDS = 2.0
LEFTOVER_RUNNER_POLL_SECONDS = 0.05
