"""How runners ended: a line each in the registry's `endings.jsonl`.

A guarded runner whose worker dies ends the clean way or is killed; its record is
gone with it, so the ending is kept here, for `sweep`, `scan` and `doctor` to read.
Two events per ending: `begun` (its watchdog saw the clean ending start; the line
holds the deadline of its grace) and `ended` (`clean`: it exited by itself;
`killed`: it was killed, with the reason); before `begun`, a runner whose main thread
is still in native code gets a `busy` line (GIL held or free, the busy wait, and the
latest it may end: the busy wait and then the grace). A sweep also records how each orphan it
ended went. A `watchdog` line says a runner's watchdog died and its understudy took over.

Lines are appended with one `write` each (atomic for lines this short), by processes
that take no lock: watchdogs and sweeps. Only a sweep, holding the registry's lock,
shortens the file. A line that is not an ending is skipped, never trusted.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, Final, Literal, TypeVar, cast, final, get_args

from ..system.identity import ProcessIdentity
from ..system.process_facts import Pid
from ..system.settings import MAX_BUSY_WAIT_SECONDS, MAX_GRACE_SECONDS
from . import trust
from .registry import Registry

ENDINGS_NAME: Final = "endings.jsonl"
SCHEMA: Final = "exo-orphan-guard/ending/1"
MAX_READ_BYTES: Final = 1 << 20
KEEP_LINES: Final = 500
"""What a sweep keeps when it shortens the file (this boot's, newest)."""
_MAX_LINE_BYTES: Final = 3072
T = TypeVar("T")

Event = Literal["busy", "begun", "ended", "watchdog"]
Gil = Literal["held", "free"]
How = Literal["clean", "killed"]
By = Literal["watchdog", "watch", "sweep", "exec", "guardian"]
BYS: Final[tuple[By, ...]] = get_args(By)
Step = Literal["worker_gone", "exit", "interrupt", "busy_wait", "grace", "at_once"]
"""`ended` only: which step of the ending ended the runner. `worker_gone`: the
`WorkerGone` raised on its main thread; `exit`: it exited with neither; `interrupt`:
it exited through Python after a SIGINT from outside (a sweep's or the guardian's);
`busy_wait`: killed, its main thread still in native code; `grace`: killed, its clean
ending over the grace; `at_once`: killed at once (no clean ending)."""
STEPS: Final[tuple[Step, ...]] = get_args(Step)
EndSignal = Literal["SIGINT", "SIGTERM", "SIGKILL"]
"""`ended` only: the last signal sent from outside before the runner was gone (None:
it ended with no signal sent)."""
END_SIGNALS: Final[tuple[EndSignal, ...]] = get_args(EndSignal)


@final
@dataclass(frozen=True, slots=True)
class Ending:
    event: Event
    pid: Pid
    started: float
    boot_id: str
    at: float
    """Wall-clock time of the event (for people; nothing is timed by it)."""
    by: By
    how: How | None = None
    """`ended` only."""
    after_seconds: float | None = None
    """`ended` only: from the notice of the worker's death (or the sweep's first
    signal) to the end."""
    why: str = ""
    deadline: float | None = None
    """`begun`: `time.monotonic()` when its grace runs out (the same clock in every
    process of one boot); `busy`: when the busy wait and then the grace would."""
    labels: Mapping[str, str] = field(default_factory=dict[str, str])
    gil: Gil | None = None
    """`busy` only: whether the runner's main thread holds the GIL in its native call."""
    busy_wait: float | None = None
    """`busy` only: seconds from the notice (`at`) until it is killed unless it returns."""
    step: Step | None = None
    """`ended` only, where known: which step of the ending ended the runner."""
    signal: EndSignal | None = None
    """`ended` only, by a sweep or the guardian: the signal that ended it."""

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.started)

    def to_line(self) -> bytes:
        document: dict[str, object] = {
            "schema": SCHEMA,
            "event": self.event,
            "pid": self.pid,
            "started": self.started,
            "boot_id": self.boot_id,
            "at": round(self.at, 3),
            "by": self.by,
            "how": self.how,
            "after_s": None if self.after_seconds is None else round(self.after_seconds, 4),
            "why": self.why,
            "deadline": self.deadline,
            "labels": dict(self.labels),
        }
        if self.event == "busy":
            document["gil"] = self.gil
            document["busy_wait_s"] = self.busy_wait
        if self.step is not None:
            document["step"] = self.step
        if self.signal is not None:
            document["signal"] = self.signal
        line = json.dumps(document, sort_keys=True).encode() + b"\n"
        if len(line) > _MAX_LINE_BYTES:  # one write stays atomic: drop what makes it long
            return replace(self, labels={}, why=self.why[:200]).to_line()
        return line


def append(path: Path | str, ending: Ending) -> bool:
    """Add one line; False if it could not be written (the ending is then unrecorded,
    never a reason to fail)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, ending.to_line())
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def record_killed(
    base: Path,
    runner: ProcessIdentity,
    boot_id: str,
    *,
    by: By,
    why: str,
    after: float,
    step: Step | None = None,
) -> bool:
    """Append a hard kill of `runner` to this host's file in the registry at `base`,
    if there is one."""
    registry, _ = Registry.open(base, create=False)
    ending = Ending(
        event="ended",
        pid=runner.pid,
        started=runner.started,
        boot_id=boot_id,
        at=time.time(),
        by=by,
        how="killed",
        after_seconds=after,
        why=why,
        step=step,
    )
    return registry is not None and append(registry.path / ENDINGS_NAME, ending)


def read(path: Path, boot_id: str, pids: Collection[int] | None = None) -> list[Ending]:
    """This boot's endings in `path` (its last `MAX_READ_BYTES`), oldest first; with
    `pids`, only theirs. Nothing if the file is missing or not trustworthy (another
    owner, writable by others, a symlink).

    Read a line at a time, and with `pids` a line that names none of them is never
    parsed: a sweeper reads this file at each step of an ending, and the guardian runs
    several endings at once; all of it parsed, four endings side by side raised its
    memory by about 3.5 MiB per 100 KiB of file, a high-water mark never given back
    (`make soak` found its RSS growing with the file up to its bound)."""
    try:
        file = trust.open_trusted(path, os.geteuid())
    except (OSError, ValueError):
        return []
    wanted = None if pids is None else frozenset(pids)
    tokens = None if wanted is None else tuple(b'"pid": %d,' % pid for pid in wanted)
    found: list[Ending] = []
    with file:
        _seek_to_tail(file)
        for line in file:
            if tokens is not None and not any(token in line for token in tokens):
                continue
            ending = parse_line(line)
            if ending is None or ending.boot_id != boot_id:
                continue
            if wanted is None or ending.pid in wanted:
                found.append(ending)
    return found


def parse_line(line: bytes) -> Ending | None:
    try:
        document: object = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(document, dict):
        return None
    fields = {str(key): value for key, value in cast(dict[object, object], document).items()}
    event, how, by = fields.get("event"), fields.get("how"), fields.get("by")
    pid, started, boot_id = fields.get("pid"), fields.get("started"), fields.get("boot_id")
    labels = fields.get("labels")
    if (
        fields.get("schema") != SCHEMA
        or event not in ("busy", "begun", "ended", "watchdog")
        or how not in ("clean", "killed", None)
        or by not in BYS
        or not _is_int(pid)
        or not _is_number(started)
        or not isinstance(boot_id, str)
        or not isinstance(labels, dict)
    ):
        return None
    return Ending(
        event=event,
        pid=Pid(cast(int, pid)),
        started=float(cast(float, started)),
        boot_id=boot_id,
        at=_number_or(fields.get("at"), 0.0),
        by=by,
        how=how,
        after_seconds=_number_or(fields.get("after_s"), None),
        why=str(fields.get("why", "")),
        deadline=_number_or(fields.get("deadline"), None),
        labels={str(key): str(value) for key, value in cast(dict[object, object], labels).items()},
        gil=gil if (gil := fields.get("gil")) in ("held", "free") else None,
        busy_wait=_number_or(fields.get("busy_wait_s"), None),
        step=step if (step := fields.get("step")) in STEPS else None,
        signal=sent if (sent := fields.get("signal")) in END_SIGNALS else None,
    )


def latest(endings: Iterable[Ending]) -> dict[ProcessIdentity, Ending]:
    """The newest word on each runner: `ended` over `begun`, `killed` over `clean`.
    A `watchdog` line says nothing of how far the ending is, and is left out."""
    found: dict[ProcessIdentity, Ending] = {}
    for ending in endings:
        if ending.event == "watchdog":
            continue
        known = found.get(ending.identity)
        if known is None or _weight(ending) >= _weight(known):
            found[ending.identity] = ending
    return found


def clean_deadline(
    ending: Ending | None, grace: float | None, now: float, wedge_seconds: float
) -> float | None:
    """Until when a sweep waits for a guarded runner to end by itself (monotonic), or
    None: not guarded for a clean ending, or already ended.

    With a `begun` line: the deadline its watchdog wrote. With a `busy` one: the latest
    its watchdog lets it live (the busy wait, then the grace), never beyond what the
    settings allow. Without either the runner may not have had the notice yet, or be
    busy and about to be recorded so: the wedge bound and a little more, after which a
    sweep reads the endings again (`recorded_deadline`).
    """
    if grace is None or grace <= 0 or (ending is not None and ending.event == "ended"):
        return None
    if ending is not None and ending.deadline is not None:
        if ending.event == "busy":
            return min(ending.deadline, now + MAX_BUSY_WAIT_SECONDS + MAX_GRACE_SECONDS)
        return min(ending.deadline, now + grace)
    return now + wedge_seconds + 0.5


def recorded_deadline(ending: Ending | None, now: float) -> float | None:
    """A deadline its watchdog wrote that is still ahead (`busy` or `begun`), else None:
    what a sweep that waited out its first deadline goes on waiting for."""
    if ending is None or ending.event == "ended" or ending.deadline is None:
        return None
    limit = now + MAX_BUSY_WAIT_SECONDS + MAX_GRACE_SECONDS
    return min(ending.deadline, limit) if ending.deadline > now else None


def hard_kills(endings: Sequence[Ending]) -> list[Ending]:
    """Runners killed rather than ended cleanly, newest first."""
    ended = [ending for ending in latest(endings).values() if ending.event == "ended"]
    return sorted(
        (ending for ending in ended if ending.how == "killed"),
        key=lambda ending: ending.at,
        reverse=True,
    )


def compact(path: Path, boot_id: str) -> None:
    """Keep this boot's newest `KEEP_LINES` lines once the file passes half of
    `MAX_READ_BYTES`, read a line at a time; called by a sweep, or the guardian's
    upkeep, under the registry's lock."""
    with contextlib.suppress(OSError, ValueError):
        if os.lstat(path).st_size <= MAX_READ_BYTES // 2:
            return
        kept: deque[bytes] = deque(maxlen=KEEP_LINES)
        with trust.open_trusted(path, os.geteuid()) as source:
            _seek_to_tail(source)
            for line in source:
                ending = parse_line(line)
                if ending is not None and ending.boot_id == boot_id:
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
        temporary = path.with_name(f".tmp-{ENDINGS_NAME}-{time.monotonic_ns()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.writelines(kept)
        os.replace(temporary, path)


def _seek_to_tail(file: BinaryIO) -> None:
    """To the first whole line of the file's last `MAX_READ_BYTES`."""
    size = os.fstat(file.fileno()).st_size
    if size > MAX_READ_BYTES:
        file.seek(size - MAX_READ_BYTES - 1)
        if file.read(1) != b"\n":
            file.readline()  # the rest of a line the bound cuts


def _weight(ending: Ending) -> int:
    return (ending.event == "ended") + (ending.how == "killed")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number_or(value: object, default: T) -> float | T:
    return float(cast(float, value)) if _is_number(value) else default
