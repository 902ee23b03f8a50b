"""What the guardian saw: each exo process it watched alive, with the runners it saw
under it, kept on disk so that what it saw outlives it.

A runner of `python -m exo` shows nothing of exo's once its exo is gone (it maps no
extension of exo's: `sweeper.exo_detect`), so the only proof that such an orphan is
exo's runner is having seen it as a child of a live exo. The guardian writes that
here whenever it changes; a guardian restarted after a SIGKILL, a sweep and a scan
read it, and judge by it as by their own eyes.

A sighting is a claim about processes, as a registry record is: it counts only for
the very processes it names (pid and start), of this boot, and the file is read only
when it can be trusted (`trust`: this user's, not writable by others, no link, a
regular file, size-capped). It stays bounded by itself: a sighting goes once none of
its runners is left, and at most `MAX_EXO` exo processes with `MAX_RUNNERS` runners
each are kept, the newest.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, cast, final

from ..system.identity import ProcessIdentity
from ..system.process_facts import Pid
from . import trust

SIGHTINGS_NAME: Final = "sightings.json"
SCHEMA: Final = "exo-orphan-guard/sightings/1"
MAX_EXO: Final = 64
MAX_RUNNERS: Final = 64
MAX_BYTES: Final = 256 * 1024
"""Far above what `MAX_EXO` sightings of `MAX_RUNNERS` runners take (about 200 KB)."""

Sightings = Mapping[ProcessIdentity, frozenset[ProcessIdentity]]
"""Each exo process seen alive, and the runners seen under it."""
NONE: Final[Sightings] = {}


def read(directory: Path, boot_id: str) -> dict[ProcessIdentity, frozenset[ProcessIdentity]]:
    """This boot's sightings in `directory`; none if the file is missing, corrupt,
    another boot's or not to be trusted."""
    try:
        with trust.open_trusted(directory / SIGHTINGS_NAME, os.geteuid()) as file:
            data = file.read(MAX_BYTES + 1)
        document: object = json.loads(data) if len(data) <= MAX_BYTES else None
    except (OSError, ValueError):
        return {}
    if not isinstance(document, dict):
        return {}
    fields = cast(dict[str, object], document)
    entries = fields.get("exo")
    if fields.get("schema") != SCHEMA or fields.get("boot_id") != boot_id:
        return {}
    if not isinstance(entries, list):
        return {}
    found: dict[ProcessIdentity, frozenset[ProcessIdentity]] = {}
    for entry in cast(list[object], entries)[-MAX_EXO:]:
        parsed = _parse_entry(entry)
        if parsed is not None:
            found[parsed[0]] = parsed[1]
    return found


@final
class Reader:
    """`read`, for a guardian that asks at every scan: the file is read and parsed again
    only when its `lstat` changed (inode, size, times, owner, mode: the guardian
    replaces it, never writes it in place), and trusted as `read` trusts it."""

    def __init__(self) -> None:
        self._last: tuple[tuple[object, ...], dict[ProcessIdentity, frozenset[ProcessIdentity]]]
        self._last = ((), {})

    def read(
        self, directory: Path, boot_id: str
    ) -> dict[ProcessIdentity, frozenset[ProcessIdentity]]:
        try:
            info = os.lstat(directory / SIGHTINGS_NAME)
        except OSError:
            return {}
        signature = (
            *(directory, boot_id, info.st_dev, info.st_ino, info.st_size),
            *(info.st_mtime_ns, info.st_ctime_ns, info.st_mode, info.st_uid),
        )
        if self._last[0] != signature:
            # Read after the lstat: a change in between shows at the next call.
            self._last = (signature, read(directory, boot_id))
        return dict(self._last[1])


def merged(
    previous: Sightings, seen: Sightings, alive: Callable[[ProcessIdentity], bool]
) -> dict[ProcessIdentity, frozenset[ProcessIdentity]]:
    """What to keep: what is `seen` now, and what was seen before of runners that are
    still `alive` (their exo may be dead: that is what the sighting is for), bounded."""
    kept: dict[ProcessIdentity, frozenset[ProcessIdentity]] = {}
    for exo in (*previous, *(exo for exo in seen if exo not in previous)):
        earlier = frozenset(runner for runner in previous.get(exo, ()) if alive(runner))
        runners = earlier | seen.get(exo, frozenset())
        if runners:
            newest = sorted(runners, key=lambda runner: runner.started)[-MAX_RUNNERS:]
            kept[exo] = frozenset(newest)
    return dict(list(kept.items())[-MAX_EXO:])


def remember(
    directory: Path,
    boot_id: str,
    seen: Sightings,
    alive: Callable[[ProcessIdentity], bool],
) -> str | None:
    """Add what is `seen` to `directory`'s sightings (written only if they change);
    a warning if they could not be written, else None."""
    previous = read(directory, boot_id)
    now = merged(previous, seen, alive)
    if now == previous:
        return None
    try:
        write(directory, boot_id, now)
    except OSError as error:
        return f"could not write {directory / SIGHTINGS_NAME}: {error.strerror or error}"
    return None


def write(directory: Path, boot_id: str, sightings: Sightings) -> None:
    """Replace the file atomically, created afresh (no link followed, no file reused)."""
    document = {
        "schema": SCHEMA,
        "boot_id": boot_id,
        "exo": [
            {
                "pid": exo.pid,
                "started": exo.started,
                "runners": [[runner.pid, runner.started] for runner in sorted(runners, key=_order)],
            }
            for exo, runners in sightings.items()
        ],
    }
    temporary = directory / f".tmp-{SIGHTINGS_NAME}-{os.getpid()}-{time.monotonic_ns()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(json.dumps(document, sort_keys=True).encode() + b"\n")
        os.replace(temporary, directory / SIGHTINGS_NAME)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _order(runner: ProcessIdentity) -> tuple[int, float]:
    return runner.pid, runner.started


def seen_under(sightings: Sightings, runner: ProcessIdentity) -> ProcessIdentity | None:
    """The exo process `runner` was seen under, or None."""
    return next((exo for exo, runners in sightings.items() if runner in runners), None)


def _parse_entry(entry: object) -> tuple[ProcessIdentity, frozenset[ProcessIdentity]] | None:
    if not isinstance(entry, dict):
        return None
    fields = cast(dict[str, object], entry)
    exo = _identity(fields.get("pid"), fields.get("started"))
    runners = fields.get("runners")
    if exo is None or not isinstance(runners, list):
        return None
    parsed: set[ProcessIdentity] = set()
    for item in cast(list[object], runners)[:MAX_RUNNERS]:
        pair = cast(list[object], item) if isinstance(item, list) else []
        runner = _identity(*pair) if len(pair) == 2 else None
        if runner is None:
            return None
        parsed.add(runner)
    return exo, frozenset(parsed)


def _identity(pid: object, started: object) -> ProcessIdentity | None:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return None
    if not isinstance(started, int | float) or isinstance(started, bool):
        return None
    return ProcessIdentity(Pid(pid), float(started))
