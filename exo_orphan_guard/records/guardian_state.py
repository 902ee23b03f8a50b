"""Who the guardian is: one per user per machine, found by its lock and its state file.

The guardian holds `guardian.lock` (`flock`) in the user's guardian directory
(`user_dir`: per user and machine, whatever the environment) for as long as it runs,
and writes `guardian.json` beside it once it holds the lock: its pid
and start (its identity), when it started, and how it was started. The lock decides
who guards; the state file says who that is, for `service status` and `doctor`. A
state file whose process is gone (a guardian SIGKILLed) says nothing: `running`
checks the identity, never the pid alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast, final, get_args

from ..system.identity import ProcessIdentity, liveness
from ..system.process_facts import Pid
from . import trust

LOCK_NAME: Final = "guardian.lock"
STATE_NAME: Final = "guardian.json"
SCHEMA: Final = "exo-orphan-guard/guardian/1"
_MAX_STATE_BYTES: Final = 4096
_LOCK_POLL_SECONDS: Final = 0.2

Mode = Literal["service", "worker", "foreground"]
"""How it was started: by launchd or systemd (`service install`), by exo's worker (it
leaves once no exo is left), or by hand."""
MODES: Final[tuple[Mode, ...]] = get_args(Mode)


@final
@dataclass(frozen=True, slots=True)
class GuardianState:
    pid: Pid
    started: float
    """The kernel's start of the process (`identity.ProcessIdentity`)."""
    boot_id: str
    since: float
    """Wall-clock time it took the lock (for people)."""
    mode: Mode
    version: str
    leaving: bool = False
    """It is about to leave (`watch_requests`): a worker finding it so starts another."""

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.started)

    def to_json(self) -> bytes:
        document = {
            "schema": SCHEMA,
            "pid": self.pid,
            "started": self.started,
            "boot_id": self.boot_id,
            "since": self.since,
            "mode": self.mode,
            "version": self.version,
            "leaving": self.leaving,
        }
        return json.dumps(document, sort_keys=True).encode() + b"\n"


def parse_state(data: bytes) -> GuardianState | None:
    try:
        document: object = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(document, dict):
        return None
    fields = {str(key): value for key, value in cast(dict[object, object], document).items()}
    pid, started, since = fields.get("pid"), fields.get("started"), fields.get("since")
    boot_id, mode, version = fields.get("boot_id"), fields.get("mode"), fields.get("version")
    leaving = fields.get("leaving", False)
    if (
        fields.get("schema") != SCHEMA
        or not (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0)
        or not isinstance(started, int | float)
        or not isinstance(since, int | float)
        or not isinstance(boot_id, str)
        or mode not in MODES
        or not isinstance(version, str)
        or not isinstance(leaving, bool)
    ):
        return None
    return GuardianState(
        pid=Pid(pid),
        started=float(started),
        boot_id=boot_id,
        since=float(since),
        mode=mode,
        version=version,
        leaving=leaving,
    )


def read_state(directory: Path) -> GuardianState | None:
    """What `guardian.json` in `directory` says, or None: missing, corrupt, or not to
    be trusted (another owner, writable by others, a symlink)."""
    try:
        with trust.open_trusted(directory / STATE_NAME, os.geteuid()) as file:
            data = file.read(_MAX_STATE_BYTES)
    except (OSError, ValueError):
        return None
    return parse_state(data)


def running(directory: Path, boot_id: str) -> GuardianState | None:
    """The guardian that runs now, by its state file: this boot's, and its process
    still the one that wrote it."""
    state = read_state(directory)
    if state is None or state.boot_id != boot_id or liveness(state.identity) == "gone":
        return None
    return state


def write_state(directory: Path, state: GuardianState) -> None:
    """Replace `guardian.json` atomically (a reader never sees half a file)."""
    temporary = directory / f".tmp-{STATE_NAME}-{os.getpid()}-{time.monotonic_ns()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(state.to_json())
    os.replace(temporary, directory / STATE_NAME)


def clear_state(directory: Path, state: GuardianState) -> None:
    """Remove `guardian.json` if it is still `state`'s process's (a successor's is
    left)."""
    found = read_state(directory)
    if found is not None and found.identity == state.identity:
        with contextlib.suppress(OSError):
            os.unlink(directory / STATE_NAME)


@contextlib.contextmanager
def guardian_lock(
    directory: Path,
    stop: threading.Event | None = None,
    on_wait: Callable[[], None] | None = None,
    keep_waiting: Callable[[], bool] | None = None,
) -> Generator[bool]:
    """Hold `guardian.lock` while the block runs: True once held. Another guardian
    holding it: wait (calling `on_wait` once) until it lets go, or until `stop` is set
    or `keep_waiting`, asked before each wait, says no (then False). The kernel lets
    go of a dead holder's lock at its exit."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(directory / LOCK_NAME, flags, 0o600)
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if keep_waiting is not None and not keep_waiting():
                    yield False
                    return
                if on_wait is not None and not told:
                    on_wait()
                    told = True
                if stop is not None and stop.wait(_LOCK_POLL_SECONDS):
                    yield False
                    return
                if stop is None:
                    time.sleep(_LOCK_POLL_SECONDS)
        yield True
    finally:
        os.close(fd)


def is_held(directory: Path) -> bool | None:
    """Whether some process holds `guardian.lock` now (None: cannot tell). Taken and
    let go at once when free: a guardian starting meanwhile waits 0.2 s at most."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False
