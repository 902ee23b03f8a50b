"""With the package installed, exo's worker makes sure a guardian runs, so that a
source install needs no `service install`: it asks to be watched
(`watch_requests`), then, unless a guardian of this user's runs and is not leaving,
starts one, detached (a session of its own: exo's Ctrl-C never reaches it), that
watches this worker from the start and leaves by itself once no exo is left to
watch. One run as a service (launchd, systemd) is left alone, and never leaves.

The guardian is started through a short-lived launcher, so that it is not exo's
child: a guardian never watches its own ancestors (its sweep never ends them), so as
exo's child it would never watch the exo that started it, and leave.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

from ..records import guardian_state, watch_requests
from ..records.registry import Registry
from ..records.user_dir import user_dir
from ..system import boot_id, settings
from ..system.identity import current_identity

LOG_NAME: Final = "guardian.log"
_LAUNCHER: Final = (
    "import subprocess, sys; "
    "print(subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=sys.stderr, "
    "stderr=sys.stderr, start_new_session=True, cwd='/').pid, flush=True)"
)
"""Starts the guardian and exits at once: the guardian's parent is then init (or a
subreaper), not exo."""
_NOT_INHERITED: Final = (settings.WORKER_ENV, settings.RUNNER_ENV)


def guardian_command(worker_pid: int) -> list[str]:
    """What the worker runs: its own interpreter has the package (the extra)."""
    return [
        sys.executable,
        "-m",
        "exo_orphan_guard",
        "service",
        "run",
        "--mode",
        "worker",
        "--leave-when-idle",
        "--watch",
        str(worker_pid),
    ]


def ensure_guardian() -> str:
    """Start a guardian unless one of this user's runs; one line saying which."""
    registry, problem = Registry.open(settings.registry_dir(), create=True)
    if registry is None:
        return f"no guardian started: {problem or 'no registry'}"
    home, problem = user_dir(create=True)
    if home is None:
        return f"no guardian started: {problem or 'no guardian directory'}"
    # First: a guardian that reads the requests from now on watches this process.
    watch_requests.request(home, current_identity())
    running = guardian_state.running(home, boot_id())
    if running is not None and not running.leaving:
        return f"the guardian runs (pid {running.pid}, {running.mode})"
    if running is None and guardian_state.is_held(home):
        return "a guardian is starting"
    pid = _start(home)
    return f"started a guardian (pid {pid}), leaving once no exo is left to watch"


def _start(directory: Path) -> int:
    environment = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    log = os.open(directory / LOG_NAME, flags, 0o600)
    try:
        launched = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, *guardian_command(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env=environment,
            cwd="/",
            check=True,
            timeout=60,
        )
    finally:
        os.close(log)
    return int(launched.stdout)
