"""A guardian run as a service waits for a registry it cannot use, instead of exiting.

launchd (`KeepAlive`) and systemd (`Restart=always`) restart a guardian that exits,
forever, every few seconds, and each start would say the same thing again: a registry
(or the user's guardian directory) on exFAT or SMB (mode 777, refused), another
user's, a read-only disk. Waiting, the
guardian says why once (again only if the reason changes), re-checks on a backoff that
grows to a minute, writes nothing, and guards as soon as the registry can be used.
`service status` and `doctor` find the same reason by opening the registry themselves.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ..records.guardian_state import LOCK_NAME
from ..records.registry import Registry
from ..records.user_dir import user_dir

FIRST_RECHECK_SECONDS: Final = 2.0
LAST_RECHECK_SECONDS: Final = 60.0
"""Re-checks a few seconds apart at first (someone fixing it is likely watching), then
once a minute: a lstat or two each."""

Opener = Callable[[], tuple[Registry | None, str | None]]


def usable_registry(base: Path) -> tuple[Registry | None, str | None]:
    """This host's registry under `base`, made if missing, and the user's guardian
    directory (`user_dir`), with a lock file the guardian can open; else None and
    why."""
    registry, problem = Registry.open(base, create=True)
    if registry is None:
        return None, problem or f"no registry at {base}"
    home, problem = user_dir(create=True)
    if home is None:
        return None, problem or "no guardian directory"
    lock = home / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        return None, f"guardian directory {home}: cannot open {lock} ({error.strerror})"
    os.close(fd)
    return registry, None


def wait_for_registry(
    open_registry: Opener,
    stop: threading.Event,
    say: Callable[[str], None],
    first: float = FIRST_RECHECK_SECONDS,
    last: float = LAST_RECHECK_SECONDS,
) -> Registry | None:
    """The registry once `open_registry` gives one; None if `stop` is set first."""
    registry, problem = open_registry()
    told: str | None = None
    delay = first
    while registry is None:
        why = problem or "no registry"
        if why != told:
            say(
                f"cannot guard yet: {why}; waiting for it, re-checking every {last:g} s at "
                "most (nothing is guarded meanwhile)"
            )
            told = why
        if stop.wait(delay):
            return None
        delay = min(delay * 2, last)
        registry, problem = open_registry()
    if told is not None:
        say(f"the registry {registry.path} can be used now: guarding")
    return registry
