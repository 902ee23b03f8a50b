"""exo processes waiting to be watched: what exo's worker leaves for the guardian.

exo's worker makes sure a guardian runs (`exo.guardian_start`). An exo that has no
runners yet and writes no pidfile (every release before exo main, the app) is
invisible to a guardian's scans until it has runners, and a guardian a worker
started leaves once no exo is left: one about to leave when a new exo found it
running would leave that exo unwatched, its later runners with no guardian at all.
So the worker first leaves a request here, `watch/<pid>.json` in the user's guardian
directory (`user_dir`) naming its identity, and only then looks for a guardian. A
guardian watches every request whose process lives, and removes the others.

A guardian that would leave says so in its state first (`GuardianState.leaving`),
then reads the requests once more, and stays if one lives: a worker that looked
before it said so left its request before that, and is seen now; one that looked
after saw it leaving, and started another guardian. A request only ever adds a
process to watch (never one to end), and is one file per live exo.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Final, cast

from ..system.identity import ProcessIdentity, liveness
from ..system.process_facts import Pid
from . import trust

DIRECTORY_NAME: Final = "watch"
_MAX_BYTES: Final = 256
_MAX_REQUESTS: Final = 4096
"""More than any user runs exo processes at once: what lies beyond is not read."""
_SUFFIX: Final = ".json"
_STALE_TEMPORARY_SECONDS: Final = 60.0


def request(home: Path, process: ProcessIdentity) -> bool:
    """Ask the guardian to watch `process`, atomically; False if it cannot be written."""
    directory = home / DIRECTORY_NAME
    temporary = directory / f".tmp-{process.pid}-{time.monotonic_ns()}"
    document = json.dumps({"pid": process.pid, "started": process.started}).encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
        if trust.problem(os.lstat(directory), os.geteuid(), "directory") is not None:
            return False
        fd = os.open(temporary, flags, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(document)
        os.replace(temporary, directory / f"{process.pid}{_SUFFIX}")
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return False
    return True


def live_requests(home: Path) -> list[ProcessIdentity]:
    """The processes asked to be watched that are still alive; the requests of those
    that are gone (or whose pid another process now holds) are removed."""
    directory = home / DIRECTORY_NAME
    uid = os.geteuid()
    try:
        if trust.problem(os.lstat(directory), uid, "directory") is not None:
            return []
        names = sorted(os.listdir(directory))[:_MAX_REQUESTS]
    except OSError:
        return []
    alive: list[ProcessIdentity] = []
    now = time.time()
    for name in names:
        path = directory / name
        if name.startswith(".tmp-"):  # of a writer that died between write and rename
            with contextlib.suppress(OSError):
                if now - os.lstat(path).st_mtime > _STALE_TEMPORARY_SECONDS:
                    os.unlink(path)
            continue
        if not name.endswith(_SUFFIX):
            continue
        process = _read(path, uid)
        if process is not None and liveness(process) != "gone":
            alive.append(process)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return alive


def _read(path: Path, uid: int) -> ProcessIdentity | None:
    try:
        with trust.open_trusted(path, uid) as file:
            document: object = json.loads(file.read(_MAX_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    fields = cast(dict[str, object], document)
    pid, started = fields.get("pid"), fields.get("started")
    if (
        not isinstance(pid, int)
        or isinstance(pid, bool)
        or pid <= 1
        or not isinstance(started, int | float)
        or isinstance(started, bool)
        or f"{pid}{_SUFFIX}" != path.name
    ):
        return None
    return ProcessIdentity(Pid(pid), float(started))
