"""A forked helper process per runner: the part of the watch that needs no GIL.

A runner stuck in native code holding the GIL (MLX's `mx.distributed.init()` does
this) cannot run any Python thread of its own. The watchdog is a separate process, so
it can wait on the worker and end the runner whatever the runner is doing.

When the worker dies it notices the runner (`NOTICE_SIGNAL`) and bounds its clean
ending: a runner that has not begun it within `WEDGE_SECONDS` is wedged, one that has
not exited within its grace is hanging; either is killed with its group. A runner
that exits in time ended cleanly. Each ending is recorded (`records.endings`). With
no clean ending (grace 0) it kills the group at once, as the only way.

It is forked, not spawned: no interpreter start-up, nothing to find on disk, and it
works the same in exo's frozen (PyInstaller) app, which cannot run `python -c`. It is
forked before the runner starts any thread of its own and touches nothing but
syscalls, so it takes no lock another thread could have held. It never outlives the
runner (a thread waits on it) nor the worker (it kills the runner's group, which
includes itself, once the runner is gone or killed).
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, NoReturn, final

from .. import system
from ..records import endings
from ..records.endings import Ending
from ..system.identity import ProcessIdentity, liveness
from ..system.process_facts import Pid
from ..system.settings import WEDGE_SECONDS
from .clean_ending import BEGUN, NOTICE_SIGNAL, SHUTTING_DOWN
from .tree_kill import kill_runner_tree
from .waiters import WaiterName, confirmed_gone, wait_for_exit

_BEGUN_FD: Final = 3
"""Where the watchdog keeps the read end of the runner's `begun` pipe."""
_CHECK_SECONDS: Final = 0.05

Outcome = Literal["clean", "shut down", "wedged", "hanging"]


@final
@dataclass(frozen=True, slots=True)
class EndingPlan:
    """How the runner ends once its worker is gone, and where that is written down."""

    grace: float
    """0: killed at once (no clean ending)."""
    begun: int | None
    """Read end of the pipe the runner writes one byte to when its ending begins (and
    that reaches EOF when it exits); None without a clean ending."""
    endings_path: str | None
    boot_id: str
    by: endings.By = "watchdog"
    labels: Mapping[str, str] = field(default_factory=dict[str, str])
    why_no_clean_ending: str = ""


def start_watchdog(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
    plan: EndingPlan,
) -> Pid:
    """Fork the watchdog and return its pid (OSError if fork fails)."""
    with warnings.catch_warnings():
        # Python >= 3.12 warns about fork in a threaded process; the child below
        # never touches a lock, so the warning does not apply to it.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _watchdog_main(worker, runner, group, chain, record_path, plan)
    return Pid(pid)


def _watchdog_main(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
    plan: EndingPlan,
) -> NoReturn:
    exit_code = 0
    try:
        # Objects copied from the runner must not be finalised here: one could close
        # an fd number that our own pidfd has since taken.
        gc.disable()
        begun = _detach_inherited_files(plan.begun)
        if os.getppid() != runner.pid:
            os._exit(0)
        threading.Thread(
            target=_exit_with_runner,
            args=(worker, runner, group, chain, record_path),
            name="exo-orphan-guard-runner-wait",
            daemon=True,
        ).start()
        wait_for_exit(worker, chain)
        noticed = time.monotonic()
        if begun is None:
            # Even if PR_SET_PDEATHSIG took the runner first: its group still holds
            # whatever the runner started, and this process keeps the group id from reuse.
            _record(plan, runner, "killed", 0.0, plan.why_no_clean_ending)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner.pid, NOTICE_SIGNAL)  # the runner may have no thread to tell it
            outcome = _await_the_ending(runner, begun, noticed, plan)
            _record(plan, runner, *_described(outcome, time.monotonic() - noticed, plan.grace))
        kill_runner_tree(runner, group)
    except BaseException:
        exit_code = 1
    finally:
        os._exit(exit_code)


def _await_the_ending(
    runner: ProcessIdentity, begun: int, noticed: float, plan: EndingPlan
) -> Outcome:
    """Wait for the runner to begin (a byte) and to exit (EOF, or gone), each in time."""
    started = shutting_down = False
    while True:
        deadline = noticed + (plan.grace if started else min(WEDGE_SECONDS, plan.grace))
        left = deadline - time.monotonic()
        if left <= 0:
            return "hanging" if started else "wedged"
        readable, _, _ = select.select([begun], [], [], min(left, _CHECK_SECONDS))
        data = os.read(begun, 64) if readable else None
        if data == b"" or liveness(runner) == "gone":
            return "shut down" if shutting_down else "clean"
        if data and BEGUN in data and not started:
            started = True
            _record(plan, runner, None, None, "its worker died", deadline=noticed + plan.grace)
        shutting_down = shutting_down or bool(data and SHUTTING_DOWN in data)


def _described(outcome: Outcome, after: float, grace: float) -> tuple[endings.How, float, str]:
    match outcome:
        case "clean":
            return "clean", after, "it exited by itself after its worker died"
        case "shut down":
            return "clean", after, "it ran its own shutdown and exited by itself"
        case "wedged":
            return (
                "killed",
                after,
                (
                    f"wedged: its main thread had not begun the clean ending {WEDGE_SECONDS:g} s "
                    "after the notice (native code holding the GIL)"
                ),
            )
        case "hanging":
            return "killed", after, f"its clean ending did not finish within the {grace:g} s grace"


def _record(
    plan: EndingPlan,
    runner: ProcessIdentity,
    how: endings.How | None,
    after: float | None,
    why: str,
    deadline: float | None = None,
) -> None:
    """An `ended` line (`how` given) or a `begun` one (with its `deadline`)."""
    if plan.endings_path is not None:
        endings.append(
            plan.endings_path,
            Ending(
                event="begun" if how is None else "ended",
                pid=runner.pid,
                started=runner.started,
                boot_id=plan.boot_id,
                at=time.time(),
                by=plan.by,
                how=how,
                after_seconds=after,
                why=why,
                deadline=deadline,
                labels=plan.labels,
            ),
        )


def _exit_with_runner(
    worker: ProcessIdentity,
    runner: ProcessIdentity,
    group: int | None,
    chain: Sequence[WaiterName],
    record_path: str | None,
) -> None:
    wait_for_exit(runner, chain)
    if confirmed_gone(worker):
        return  # the worker went first: the main thread records how the runner ended
    if record_path is not None:
        # The runner died while its worker lives (exo stopped or killed it): its
        # record is stale.
        with contextlib.suppress(OSError):
            os.unlink(record_path)
    # Whatever took the runner (exo's own stop, Ctrl-C's SIGINT reaching only the
    # worker's group), what it started dies with it, as it would have by the
    # terminal's signal before the runner left the worker's group. The group kill
    # ends this process too.
    kill_runner_tree(runner, group)
    os._exit(0)


def _detach_inherited_files(begun: int | None) -> int | None:
    """Hold none of the runner's pipes (exo waits for EOF on its stdout and stderr),
    but the read end of the `begun` pipe, moved to `_BEGUN_FD`."""
    if begun is not None and begun != _BEGUN_FD:
        os.dup2(begun, _BEGUN_FD)
        begun = _BEGUN_FD
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    system.close_inherited_files(_BEGUN_FD if begun is None else _BEGUN_FD + 1)
    if begun is not None:
        os.set_inheritable(begun, False)
    return begun
