"""What the stand-in runners that stand in the notice's way do (`scenario_worker`):
take SIGUSR1 over below Python as `faulthandler.register` does, block it, and wait
where only a signal's own handler can interrupt them."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
from typing import Final

SLOW_DUMP_SECONDS: Final = 0.3
"""How long after its worker was killed a `dumpslow` runner's stack dumps stay stuck."""


def block_the_notice() -> None:
    """Before the guard is armed: every thread started afterwards, the guard's own
    included, inherits the mask, so no thread can take the signal."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def dump_stacks_on_the_notice(slow_until: str | None = None) -> None:
    """The usual "dump my stacks" hook, to stderr, or into a pipe that takes nothing
    until `SLOW_DUMP_SECONDS` after the file `slow_until` appears (the test's sign that
    the worker was killed): a slow terminal, a full log pipe. faulthandler's handler
    then stays in its `write` that long, and a notice sent meanwhile waits for it.

    It dumps this thread's stack only: a dump of every thread (the default) reads the
    others' states without a lock, and one that exits meanwhile (the guard's watch
    thread does, once it has told the main thread) can crash it, SIGSEGV: seen with a
    dump held in the pipe, and perhaps once in about a hundred runs without. How the
    notice is taken over is the same either way."""
    file = sys.stderr if slow_until is None else _slow_pipe(slow_until)
    faulthandler.register(signal.SIGUSR1, file=file, all_threads=False)


def wait_in_one_read() -> None:
    """One `read` of a pipe nobody writes, as a runner waiting for its next task is:
    faulthandler's handler (`SA_RESTART`) has the kernel restart it."""
    unread, _unwritten = os.pipe()  # the write end stays open: no EOF
    os.read(unread, 1)


def _slow_pipe(slow_until: str) -> int:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, bytes(65536))
    os.set_blocking(write_end, True)
    # Drained by another process: a thread of this one could hold the GIL, or be the
    # thread whose handler is stuck. It is in the runner's group, and goes with it.
    subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            'while [ ! -e "$1" ]; do sleep 0.01; done; sleep "$2"; exec cat >/dev/null',
            "sh",
            slow_until,
            str(SLOW_DUMP_SECONDS),
        ],
        stdin=read_end,
    )
    os.close(read_end)
    return write_end
