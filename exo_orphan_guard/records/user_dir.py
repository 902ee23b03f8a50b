"""The guardian's directory: one per user and machine, whatever the environment.

The registry follows exo's directories (`EXO_HOME`, and `XDG_CACHE_HOME` on Linux)
and `EXO_ORPHAN_GUARD_DIR`, so a guardian run by launchd or systemd, with another
environment than exo's (or the app's), names another registry than exo's worker
does. What makes the guardian one per user must not follow them, so it lives here:
`guardian.lock` and `guardian.json` (`guardian_state`), the log of a guardian exo's
worker starts, the exo processes waiting to be watched (`watch_requests`), and the
record of endings sweepers have begun (`begun_record`), so that two sweepers
configured differently (a service and a worker-started guardian, a sweep from
another shell) never both SIGINT one runner.

It is `~/.exo-orphan-guard` in the home the password database names
(`settings.user_dir_setting`), with a subdirectory per host as the registry has
(`host_key`: a home shared over NFS, a volume shared by containers), made 700 and
checked as the registry is: the user's own, writable by no one else, no symlink.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..system import settings
from . import trust
from .host_key import host_key


def user_dir(*, create: bool) -> tuple[Path | None, str | None]:
    """This host's directory, made if `create`, or None and a one-line reason (None
    and no reason: there is none yet)."""
    root = settings.user_dir_setting().value
    path = root / host_key().name
    uid = os.geteuid()
    for directory in (root, path):
        if create:
            try:
                directory.mkdir(mode=0o700, exist_ok=True, parents=directory == root)
            except OSError as error:
                return None, f"guardian directory {directory}: cannot create it ({error.strerror})"
        try:
            info = os.lstat(directory)
        except FileNotFoundError:
            return None, None
        except OSError as error:
            return None, f"guardian directory {directory}: cannot read it ({error.strerror})"
        problem = trust.problem(info, uid, "directory")
        if problem is not None:
            return None, f"guardian directory {directory} {problem}: refusing to use it"
    return path, None
