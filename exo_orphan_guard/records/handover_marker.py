"""The hand-over marker: how the guardian knows that an exo worker's runners end by
themselves when it dies, on macOS too (no process's environment is readable there).

exo's in-tree hooks module (the series, with `EXO_ORPHAN_GUARD=true`, no package
needed) writes `<registry base>/handover/<worker pid>.json`, `{"pid": ..., "at": ...}`,
at the worker's start: each of its runners then hands itself exo's own `Shutdown`
when the worker dies. The guardian gives such runners the grace before its SIGINT,
so that it never interrupts exo's own `Runner.shutdown`. A marker is a claim about a
pid: it counts only if written after that process started (a reused pid's marker is
older than its process), and it can only delay a signal, never cause one.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Final, cast

from .. import system
from . import trust

DIRECTORY_NAME: Final = "handover"
START_SLACK_SECONDS: Final = 2.0
"""A process's wall-clock start, as psutil tells it, moves with clock steps and (macOS)
a boot time read in whole seconds."""
_MAX_BYTES: Final = 4096
_STALE_TEMPORARY_SECONDS: Final = 60.0


def marker_path(base: Path, pid: int) -> Path:
    return base / DIRECTORY_NAME / f"{pid}.json"


def written_at(base: Path, pid: int) -> float | None:
    """When the marker for `pid` under `base` was written, or None: none, corrupt,
    another pid's, or not to be trusted (another owner, writable by others, a link)."""
    try:
        with trust.open_trusted(marker_path(base, pid), os.geteuid()) as file:
            data = file.read(_MAX_BYTES)
        document: object = json.loads(data)
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    fields = cast(dict[str, object], document)
    at = fields.get("at")
    if fields.get("pid") != pid or not isinstance(at, int | float) or isinstance(at, bool):
        return None
    return float(at)


def hands_over(base: Path, pid: int, wall_start: float) -> bool:
    """Whether the process `pid` that started at `wall_start` (seconds since the epoch)
    wrote a marker: its runners hand themselves their Shutdown."""
    at = written_at(base, pid)
    return at is not None and at >= wall_start - START_SLACK_SECONDS


def remove(base: Path, pid: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(marker_path(base, pid))


def remove_stale(base: Path, now: float) -> int:
    """Remove the markers no process can claim any more: their pid is gone, or now
    held by a process that started after the marker was written, or they are not
    markers at all; and exo's temporaries (`.*.tmp`) older than a minute, of a
    writer that died before its rename. How many were removed. A marker is removed at
    its exo's watched death too; this is for those that died unwatched."""
    directory = base / DIRECTORY_NAME
    try:
        if trust.problem(os.lstat(directory), os.geteuid(), "directory") is not None:
            return 0
        names = os.listdir(directory)
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = directory / name
        with contextlib.suppress(OSError):
            if name.startswith(".") and name.endswith(".tmp"):
                stale = now - os.lstat(path).st_mtime > _STALE_TEMPORARY_SECONDS
            elif name.endswith(".json") and name[: -len(".json")].isdigit():
                stale = _claims_nothing(base, int(name[: -len(".json")]))
            else:
                continue
            if stale:
                os.unlink(path)
                removed += 1
    return removed


def _claims_nothing(base: Path, pid: int) -> bool:
    at = written_at(base, pid)
    details = system.process_details(pid)
    return at is None or details is None or at < details.create_time - START_SLACK_SECONDS
