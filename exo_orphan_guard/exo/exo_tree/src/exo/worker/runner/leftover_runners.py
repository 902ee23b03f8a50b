"""The worker's start-up sweep: runners a dead exo left behind, ended before the
worker plans its own.

A runner whose worker died and that did not end through its Shutdown (it was busy,
or it never looked at its tasks again) still holds its model's memory and RDMA queue
pairs, and the next runner on the node fails to connect or does not fit. Only runners
exo recorded are touched (`runner_record`): a record whose worker is gone, whose
runner still has the recorded identity and is still a multiprocessing child process.

Each leftover is ended the clean way first: SIGINT on its main thread, which raises
KeyboardInterrupt there and unwinds it through Python, then, if it is still there
after LEFTOVER_RUNNER_INTERRUPT_SECONDS, SIGKILL. Leftovers are ended side by side,
so the sweep waits at most LEFTOVER_RUNNER_RESUME_SECONDS +
LEFTOVER_RUNNER_INTERRUPT_SECONDS + LEFTOVER_RUNNER_KILL_SECONDS. It waits on the
event loop, so exo's own stop cancels it at once.
"""

import errno
import os
import signal
import sys
from pathlib import Path

import anyio
import psutil
from loguru import logger

from exo.shared.constants import (
    EXO_ORPHAN_GUARD,
    EXO_RUNNER_RECORDS_DIR,
    LEFTOVER_RUNNER_INTERRUPT_SECONDS,
    LEFTOVER_RUNNER_KILL_SECONDS,
    LEFTOVER_RUNNER_POLL_SECONDS,
    LEFTOVER_RUNNER_RESUME_SECONDS,
)
from exo.worker.runner.runner_record import (
    RunnerRecord,
    forget,
    read_records,
    still_running,
)

# pidfd_open(2) and pidfd_send_signal(2), Linux 6.9: a pidfd of one thread, and a
# signal to that thread alone.
_PIDFD_THREAD = os.O_EXCL
_PIDFD_SIGNAL_THREAD = 1


async def end_leftover_runners() -> None:
    if not EXO_ORPHAN_GUARD:
        return
    leftovers = find_leftover_runners(EXO_RUNNER_RECORDS_DIR)
    async with anyio.create_task_group() as tg:
        for path, record, process in leftovers:
            tg.start_soon(_end_leftover_runner, path, record, process)


def find_leftover_runners(
    directory: Path,
) -> list[tuple[Path, RunnerRecord, psutil.Process]]:
    """The recorded runners whose worker is gone; the records of runners that are
    gone themselves are removed."""
    leftovers: list[tuple[Path, RunnerRecord, psutil.Process]] = []
    for path, record in read_records(directory):
        process = still_running(record.runner)
        if process is None:
            forget(path)
        elif still_running(record.worker) is None and _is_spawned_child(
            process, record
        ):
            leftovers.append((path, record, process))
    return leftovers


def _is_spawned_child(process: psutil.Process, record: RunnerRecord) -> bool:
    try:
        return (
            process.ppid() != record.worker.pid
            and "--multiprocessing-fork" in process.cmdline()
        )
    except (psutil.Error, OSError, SystemError):
        # psutil can raise OSError or SystemError for a process exiting meanwhile
        return False


async def _end_leftover_runner(
    path: Path, record: RunnerRecord, process: psutil.Process
) -> None:
    logger.warning(
        f"Ending runner {process.pid} left behind by a dead exo (worker {record.worker.pid})"
    )
    if not await _resumed(process):
        logger.warning(f"Leaving runner {process.pid} alone: it stays stopped")
        return
    interrupted = _send(process, signal.SIGINT, main_thread=True)
    if interrupted and await _gone(process, LEFTOVER_RUNNER_INTERRUPT_SECONDS):
        logger.info(f"Leftover runner {process.pid} ended on SIGINT")
    else:
        _send(process, signal.SIGKILL)
        if not await _gone(process, LEFTOVER_RUNNER_KILL_SECONDS):
            logger.warning(
                f"Leftover runner {process.pid} is still there after SIGKILL"
            )
            return
        logger.warning(f"Leftover runner {process.pid} ended by SIGKILL")
    forget(path)


async def _resumed(process: psutil.Process) -> bool:
    """Whether `process` runs: a stopped process gets SIGCONT, and never SIGINT while
    it is stopped (another of its threads would take it, once it runs again)."""
    if not _stopped(process):
        return True
    _send(process, signal.SIGCONT)
    with anyio.move_on_after(LEFTOVER_RUNNER_RESUME_SECONDS):
        while _stopped(process):
            await anyio.sleep(LEFTOVER_RUNNER_POLL_SECONDS)
        return True
    return False


def _stopped(process: psutil.Process) -> bool:
    try:
        return process.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


async def _gone(process: psutil.Process, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        while _running(process):
            await anyio.sleep(LEFTOVER_RUNNER_POLL_SECONDS)
        return True
    return False


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _send(process: psutil.Process, signum: int, *, main_thread: bool = False) -> bool:
    """`signum` to `process` only while it is still the process recorded; SIGINT to
    its main thread, where Python runs signal handlers."""
    if sys.platform == "linux":
        # A pidfd pins the process: once it is open, a signal through it reaches that
        # process or none, so the identity is checked after it is opened.
        try:
            fd = os.pidfd_open(process.pid, _PIDFD_THREAD if main_thread else 0)
        except OSError as e:
            if main_thread and e.errno == errno.EINVAL:
                # before Linux 6.9: a process-directed signal goes to the main
                # thread first, since the process is not stopped
                return _send(process, signum)
            return False
        try:
            if not _running(process):
                return False
            signal.pidfd_send_signal(
                fd, signum, None, _PIDFD_SIGNAL_THREAD if main_thread else 0
            )
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
    # macOS gives a process-directed signal to the first thread that does not block
    # it, the main thread; psutil checks the process is still the same one first.
    try:
        process.send_signal(signum)
    except psutil.Error:
        return False
    return True
