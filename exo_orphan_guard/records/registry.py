"""The runner registry: one small JSON file per guarded runner, in a private directory.

Records say who a runner is and which worker it belongs to, so a sweep can tell an
orphan from a live worker's runner without guessing. A record is a claim, not a proof:
the sweep re-checks every field against the live process before acting on it.

Anything in the directory that another user could have written or swapped (foreign
owner, group/other-writable, symlink) is refused with a warning and never acted on.

Records live in a subdirectory per host (`host_key`: the hardware UUID on macOS, the
hostname and pid namespace on Linux): a home directory shared over NFS, or a volume
shared by containers, holds records whose pids mean nothing here. A sweep reads,
judges and deletes only its own host's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, cast, final

from ..system.identity import ProcessIdentity
from ..system.process_facts import Pid
from . import trust
from .host_key import directory_to_read, host_key, move_legacy_records
from .host_key import host_directory as host_directory

SCHEMA: Final = "exo-orphan-guard/runner-record/1"
RECORD_PREFIX: Final = "runner-"
RECORD_SUFFIX: Final = ".json"
TEMP_PREFIX: Final = ".tmp-"
LOCK_NAME: Final = "sweep.lock"
MAX_RECORD_BYTES: Final = 64 * 1024
STALE_TEMP_SECONDS: Final = 60.0
_LOCK_POLL_SECONDS: Final = 0.05


@final
@dataclass(frozen=True, slots=True)
class RunnerRecord:
    pid: Pid
    started: float
    boot_id: str
    uid: int
    worker: ProcessIdentity
    exe: str | None
    argv: tuple[str, ...]
    pgid: int | None
    recorded_at: float
    labels: Mapping[str, str] = field(default_factory=dict[str, str])
    grace: float | None = None
    """Seconds the runner may take to end the clean way once its worker is gone; None:
    it is killed at once (EXO_ORPHAN_GUARD_GRACE=0, or no clean ending here)."""

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.started)

    def to_json(self) -> bytes:
        document = {
            "schema": SCHEMA,
            "pid": self.pid,
            "started": self.started,
            "boot_id": self.boot_id,
            "uid": self.uid,
            "worker": {"pid": self.worker.pid, "started": self.worker.started},
            "exe": self.exe,
            "argv": list(self.argv),
            "pgid": self.pgid,
            "recorded_at": self.recorded_at,
            "labels": dict(self.labels),
            "grace": self.grace,
        }
        return json.dumps(document, sort_keys=True).encode()


@final
@dataclass(frozen=True, slots=True)
class LoadedRecord:
    path: Path
    record: RunnerRecord


def parse_record(data: bytes) -> RunnerRecord:
    """The record in `data`; ValueError saying what is wrong with it otherwise."""
    try:
        document: object = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not JSON ({error})") from error
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    fields = {str(key): value for key, value in cast(dict[object, object], document).items()}
    if fields.get("schema") != SCHEMA:
        raise ValueError(f"schema is {fields.get('schema')!r}, expected {SCHEMA!r}")
    worker = _object(fields, "worker")
    labels = _object(fields, "labels")
    argv = fields.get("argv")
    if not isinstance(argv, list):
        raise ValueError("argv is not a list of strings")
    words = cast(list[object], argv)
    if not all(isinstance(word, str) for word in words):
        raise ValueError("argv is not a list of strings")
    if not all(isinstance(value, str) for value in labels.values()):
        raise ValueError("labels are not all strings")
    exe = fields.get("exe")
    if exe is not None and not isinstance(exe, str):
        raise ValueError("exe is not a string")
    pgid = fields.get("pgid")
    if pgid is not None and not _is_int(pgid):
        raise ValueError("pgid is not an integer")
    grace = None if fields.get("grace") is None else _number(fields, "grace")
    return RunnerRecord(
        pid=Pid(_positive_int(fields, "pid")),
        started=_number(fields, "started"),
        boot_id=_string(fields, "boot_id"),
        uid=_positive_int(fields, "uid", allow_zero=True),
        worker=ProcessIdentity(Pid(_positive_int(worker, "pid")), _number(worker, "started")),
        exe=exe,
        argv=tuple(str(word) for word in words),
        pgid=pgid if isinstance(pgid, int) else None,
        recorded_at=_number(fields, "recorded_at"),
        labels={key: str(value) for key, value in labels.items()},
        grace=grace,
    )


def record_file_problem(info: os.stat_result, uid: int) -> str | None:
    """Why a record file must not be trusted, or None."""
    found = trust.file_problem(info, uid)
    if found is None and info.st_size > MAX_RECORD_BYTES:
        return f"is {info.st_size} bytes, more than a record can be"
    return found


@final
class LockUnavailableError(OSError):
    """The lock file cannot be opened (a read-only or full disk, say)."""


@final
class Registry:
    """A registry directory that passed the ownership and mode checks."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @staticmethod
    def open(base: Path, *, create: bool) -> tuple[Registry | None, str | None]:
        """This host's registry under `base`, or None and a one-line reason to warn with
        (None and no reason: there is none yet)."""
        uid = os.geteuid()
        key = host_key()
        path = base / key.name if create else directory_to_read(base, key)
        for directory in (base, path):
            if create:
                try:
                    directory.mkdir(mode=0o700, exist_ok=True, parents=directory == base)
                except OSError as error:
                    return None, f"orphan registry {directory}: cannot create it ({error.strerror})"
            try:
                info = os.lstat(directory)
            except FileNotFoundError:
                return None, None
            except OSError as error:
                return None, f"orphan registry {directory}: cannot read it ({error.strerror})"
            problem = trust.problem(info, uid, "directory")
            if problem is not None:
                return None, f"orphan registry {directory} {problem}: refusing to use it"
        if create:
            move_legacy_records(base, key, uid)
        return Registry(path), None

    def record_path(self, pid: int) -> Path:
        return self.path / f"{RECORD_PREFIX}{pid}{RECORD_SUFFIX}"

    def write(self, record: RunnerRecord) -> Path:
        """Atomically: readers see the old file, the new one, or none; never half."""
        final_path = self.record_path(record.pid)
        temp_path = self.path / f"{TEMP_PREFIX}{record.pid}-{time.monotonic_ns()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp_path, flags, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(record.to_json())
            os.replace(temp_path, final_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_path)
            raise
        return final_path

    def remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def load(self) -> tuple[list[LoadedRecord], list[str]]:
        """Every trustworthy record, and one warning per file that was not."""
        records: list[LoadedRecord] = []
        warnings: list[str] = []
        uid = os.geteuid()
        try:
            names = sorted(os.listdir(self.path))
        except OSError as error:
            return records, [f"orphan registry {self.path}: cannot list it ({error.strerror})"]
        for name in names:
            if not (name.startswith(RECORD_PREFIX) and name.endswith(RECORD_SUFFIX)):
                continue
            path = self.path / name
            try:
                records.append(LoadedRecord(path, self._read_trusted(path, uid)))
            except FileNotFoundError:
                continue  # removed by its runner or a concurrent sweep meanwhile
            except (OSError, ValueError) as error:
                warnings.append(f"orphan registry: ignoring {path}: {error}")
        return records, warnings

    def remove_stale_temporaries(self, now: float) -> None:
        """Temp files of writers that crashed between create and rename."""
        with contextlib.suppress(OSError):
            for name in os.listdir(self.path):
                if not name.startswith(TEMP_PREFIX):
                    continue
                path = self.path / name
                with contextlib.suppress(OSError):
                    info = os.lstat(path)
                    if stat.S_ISREG(info.st_mode) and now - info.st_mtime > STALE_TEMP_SECONDS:
                        os.unlink(path)

    @contextlib.contextmanager
    def locked(self, timeout: float, stop: threading.Event | None = None) -> Generator[bool]:
        """Serialise sweeps; yields False (and does not wait longer) on timeout, or
        once `stop` is set.

        LockUnavailableError, before anything is yielded, if there is no lock file or
        the filesystem cannot lock it.
        """
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path / LOCK_NAME, flags, 0o600)
        except OSError as error:
            raise LockUnavailableError(
                error.errno, f"orphan registry {self.path}: no lock file ({error.strerror})"
            ) from error
        try:
            deadline = time.monotonic() + timeout
            stopping = stop or threading.Event()  # never set: a plain pause
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline or stopping.wait(_LOCK_POLL_SECONDS):
                        yield False
                        return
                except OSError as error:  # ENOLCK: a filesystem without locks (NFS, say)
                    raise LockUnavailableError(
                        error.errno,
                        f"orphan registry {self.path}: cannot lock it ({error.strerror})",
                    ) from error
            yield True
        finally:
            os.close(fd)

    def _read_trusted(self, path: Path, uid: int) -> RunnerRecord:
        with trust.open_trusted(path, uid, record_file_problem) as file:
            return parse_record(file.read(MAX_RECORD_BYTES + 1))


def _object(fields: Mapping[str, object], key: str) -> dict[str, object]:
    value = fields.get(key)
    if not isinstance(value, dict):
        raise ValueError(f"{key} is not an object")
    return {str(name): item for name, item in cast(dict[object, object], value).items()}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(fields: Mapping[str, object], key: str, *, allow_zero: bool = False) -> int:
    value = fields.get(key)
    if not _is_int(value) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise ValueError(f"{key} is not a {'non-negative' if allow_zero else 'positive'} integer")
    return value


def _number(fields: Mapping[str, object], key: str) -> float:
    value = fields.get(key)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{key} is not a non-negative number")
    return float(value)


def _string(fields: Mapping[str, object], key: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} is not a non-empty string")
    return value
