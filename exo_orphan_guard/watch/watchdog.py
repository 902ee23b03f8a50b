"""A forked helper process per runner: the part of the watch that needs no GIL.

A runner stuck in native code holding the GIL (MLX's `mx.distributed.init()` does
this) cannot run any Python thread of its own. The watchdog is a separate process, so
it can wait on the worker and kill the runner whatever the runner is doing.

It is forked, not spawned: no interpreter start-up, nothing to find on disk, and it
works the same in exo's frozen (PyInstaller) app, which cannot run `python -c`. It is
forked before the runner starts any thread of its own and touches nothing but
syscalls, so it takes no lock another thread could have held. It never outlives the
runner (a thread waits on it) nor the worker (it
kills the runner's group, which includes itself).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import warnings
from collections.abc import Sequence
from typing import NoReturn

from .. import system
from ..system.identity import ProcessIdentity
from ..system.process_facts import Pid
from .tree_kill import kill_runner_tree
from .waiters import WaiterName, confirmed_gone, wait_for_exit


def start_watchdog(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
) -> Pid:
    """Fork the watchdog and return its pid (OSError if fork fails)."""
    with warnings.catch_warnings():
        # Python >= 3.12 warns about fork in a threaded process; the child below
        # never touches a lock, so the warning does not apply to it.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _watchdog_main(worker, runner, group, chain, record_path)
    return Pid(pid)


def _watchdog_main(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
) -> NoReturn:
    exit_code = 0
    try:
        # Objects copied from the runner must not be finalised here: one could close
        # an fd number that our own pidfd has since taken.
        gc.disable()
        _detach_inherited_files()
        if os.getppid() != runner.pid:
            os._exit(0)
        threading.Thread(
            target=_exit_with_runner,
            args=(worker, runner, group, chain, record_path),
            name="exo-orphan-guard-runner-wait",
            daemon=True,
        ).start()
        wait_for_exit(worker, chain)
        # Even if PR_SET_PDEATHSIG took the runner first: its group still holds
        # whatever the runner started, and this process keeps the group id from reuse.
        kill_runner_tree(runner, group)
    except BaseException:
        exit_code = 1
    finally:
        os._exit(exit_code)


def _exit_with_runner(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
) -> None:
    wait_for_exit(runner, chain)
    if not confirmed_gone(worker) and record_path is not None:
        # The runner died while its worker lives (exo stopped or killed it): its
        # record is stale.
        with contextlib.suppress(OSError):
            os.unlink(record_path)
    # Whatever took the runner (its worker's death and PR_SET_PDEATHSIG, exo's own
    # stop, Ctrl-C's SIGINT reaching only the worker's group), what it started dies
    # with it, as it would have by the terminal's signal before the runner left the
    # worker's group. The group kill ends this process too.
    kill_runner_tree(runner, group)
    os._exit(0)


def _detach_inherited_files() -> None:
    """Hold none of the runner's pipes: exo waits for EOF on its stdout and stderr."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    system.close_inherited_files(3)
