"""Records of guarded runners, kept in exo's cache directory.

A guarded runner writes `<EXO_RUNNER_RECORDS_DIR>/<pid>.json` as it starts: its own
identity and its worker's, each a pid and that process's start time. The worker's
start-up sweep reads them back: a record whose worker is gone while its runner still
has the recorded identity names a runner that a dead exo left behind. A pid alone is
never enough, since pids are reused; the start time tells a reused pid apart.

Records cannot pile up: there is at most one per runner pid, and every runner start
and every sweep removes the records whose runner is gone.
"""

import contextlib
import os
import tempfile
from pathlib import Path
from typing import final

import psutil
from pydantic import BaseModel, ConfigDict

# FrozenModel's frozen, strict and extra="forbid" (exo.utils.pydantic_ext): the
# records run in exo from v1.0.61 on, and FrozenModel is there from v1.0.64
RECORD_CONFIG = ConfigDict(frozen=True, strict=True, extra="forbid")


@final
class ProcessIdentity(BaseModel):
    model_config = RECORD_CONFIG

    pid: int
    started: float
    """psutil's create_time()"""


@final
class RunnerRecord(BaseModel):
    model_config = RECORD_CONFIG

    runner: ProcessIdentity
    worker: ProcessIdentity


def identity_of(pid: int) -> ProcessIdentity | None:
    try:
        return ProcessIdentity(pid=pid, started=psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def still_running(identity: ProcessIdentity) -> psutil.Process | None:
    """The process `identity` names, if it is still that process and has not exited."""
    try:
        process = psutil.Process(identity.pid)
        if (
            process.create_time() != identity.started
            or process.status() == psutil.STATUS_ZOMBIE
        ):
            return None
    except psutil.Error:
        return None
    return process


def record_runner(directory: Path, worker_pid: int) -> None:
    """Record this process as a runner of the live worker `worker_pid`: written whole
    or not at all, so a reader never sees half a record."""
    runner = identity_of(os.getpid())
    worker = identity_of(worker_pid)
    # Only a live parent makes the worker's identity true: once it has died, its pid
    # may already be another process's.
    if runner is None or worker is None or os.getppid() != worker_pid:
        return
    directory.mkdir(parents=True, exist_ok=True)
    remove_gone(directory)
    record = RunnerRecord(runner=runner, worker=worker)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(record.model_dump_json())
        os.replace(temporary, directory / f"{runner.pid}.json")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def read_records(directory: Path) -> list[tuple[Path, RunnerRecord]]:
    """Every readable record. A file that is not one (corrupt, or not written by
    record_runner) fails validation, names no process and is removed; one that cannot
    be read now is skipped."""
    records: list[tuple[Path, RunnerRecord]] = []
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(directory.glob("*.json")):
            try:
                records.append(
                    (path, RunnerRecord.model_validate_json(path.read_bytes()))
                )
            except ValueError:  # pydantic's ValidationError is one
                forget(path)
            except OSError:
                continue
    return records


def remove_gone(directory: Path) -> None:
    for path, record in read_records(directory):
        if still_running(record.runner) is None:
            forget(path)


def forget(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
