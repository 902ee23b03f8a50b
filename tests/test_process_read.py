"""What psutil raises for a process reaped mid-read on macOS, injected into every reader
a sweep, scan or doctor uses: none may abort, and none may take the process for gone.

The shapes, from psutil's source: 7.2.1's `cmdline()` raises `OSError` with errno 0
(`arch/osx/proc_utils.c`, psutil #2708); 7.2.2's raises `SystemError` ("returned a
result with an exception set": the errno-0 branch sets AccessDenied and returns
success, psutil #2854). Any other errno, and AccessDenied, are "unreadable now" too.
"""

from __future__ import annotations

import errno
import functools
import os
import subprocess
from collections.abc import Callable, Iterator

import psutil
import pytest

from exo_orphan_guard.sweeper import family, process_table
from exo_orphan_guard.system._posix import (  # the portable backend: what macOS runs
    child_pids,
    descendants,
    is_stopped,
    iter_command_lines,
    memory_usage,
    parent_pid,
    read_start,
    stuck_state,
)
from exo_orphan_guard.system.identity import identity_of
from exo_orphan_guard.system.process_facts import Pid


def psutil_7_2_1(pid: int) -> BaseException:
    return OSError(0, "Undefined error: 0 (originated from sysctl(KERN_PROCARGS2))")


def psutil_7_2_2(pid: int) -> BaseException:
    error = SystemError("<built-in function proc_cmdline> returned a result with an exception set")
    error.__cause__ = psutil.AccessDenied(pid)
    return error


def access_denied(pid: int) -> BaseException:
    return psutil.AccessDenied(pid)


def other_errno(pid: int) -> BaseException:
    return OSError(errno.EIO, "Input/output error")


SHAPES = pytest.mark.parametrize(
    "shape",
    [psutil_7_2_1, psutil_7_2_2, access_denied, other_errno],
    ids=["psutil-7.2.1-oserror-0", "psutil-7.2.2-systemerror", "access-denied", "eio"],
)
Shape = Callable[[int], BaseException]


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the test's own, with a child of its own (what a tree walk meets)."""
    process = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 600 & wait", "eog-process-read-token"],
        start_new_session=True,
    )
    try:
        while not psutil.Process(process.pid).children():
            pass
        yield process
    finally:
        os.killpg(process.pid, 9)
        process.wait()


def failing(monkeypatch: pytest.MonkeyPatch, method: str, victims: set[int], shape: Shape) -> None:
    """psutil.Process.<method> raises `shape` for `victims` only."""
    real = getattr(psutil.Process, method)

    @functools.wraps(real)  # keeps psutil's oneshot() cache hooks on memoized methods
    def replacement(self: psutil.Process, *args: object, **kwargs: object) -> object:
        if self.pid in victims:
            raise shape(self.pid)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(psutil.Process, method, replacement)


def test_only_no_such_process_means_gone() -> None:
    from exo_orphan_guard.system.process_read import Unread, read, read_or

    def raising(error: BaseException) -> Callable[[], int]:
        def call() -> int:
            raise error

        return call

    for error in (
        psutil.NoSuchProcess(4242),
        psutil.ZombieProcess(4242),
        ProcessLookupError(errno.ESRCH, "No such process"),
    ):
        gone = read(raising(error))
        assert isinstance(gone, Unread) and gone.gone, error
    for error in (
        psutil_7_2_1(4242),
        psutil_7_2_2(4242),
        psutil.AccessDenied(4242),
        OSError(errno.EMFILE, "Too many open files"),
    ):
        unread = read(raising(error))
        assert isinstance(unread, Unread) and not unread.gone, error
    assert read_or(raising(psutil_7_2_2(4242)), "default") == "default"
    assert read(lambda: 7) == 7


@SHAPES
def test_the_snapshot_survives_an_unreadable_command_line(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, shape: Shape
) -> None:
    failing(monkeypatch, "cmdline", {child.pid}, shape)
    table = process_table.gather([child.pid], fingerprint=False, match=None)
    # Unreadable now: kept (its command line unknown) or unreadable, never gone.
    kept = table.processes.get(Pid(child.pid))
    assert child.pid in table.unreadable or (kept is not None and kept.argv == ())


@SHAPES
def test_the_portable_command_line_scan_survives_it(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, shape: Shape
) -> None:
    failing(monkeypatch, "cmdline", {child.pid}, shape)
    found = dict(iter_command_lines())
    assert os.getpid() in found and child.pid not in found


@SHAPES
@pytest.mark.parametrize("method", ["status", "ppid"])
def test_the_portable_readers_say_unreadable_not_gone(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, shape: Shape, method: str
) -> None:
    failing(monkeypatch, method, {child.pid}, shape)
    reader = read_start if method == "status" else parent_pid
    with pytest.raises(PermissionError, match=f"cannot read process {child.pid}"):
        reader(child.pid)


@SHAPES
def test_the_portable_helpers_fall_back(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, shape: Shape
) -> None:
    for method in ("children", "memory_info", "status"):
        failing(monkeypatch, method, {child.pid}, shape)
    assert child_pids(child.pid) == []
    assert descendants(child.pid) == []
    assert memory_usage(child.pid) is None
    assert stuck_state(child.pid) is None
    assert is_stopped(child.pid) is None


@SHAPES
@pytest.mark.parametrize("method", ["cmdline", "uids"])
def test_the_tree_walk_before_a_kill_survives_it_and_takes_nothing_unread(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, shape: Shape, method: str
) -> None:
    target = identity_of(child.pid)
    assert target is not None
    (grandchild,) = psutil.Process(child.pid).children()
    # uids of the target (its family's user), cmdline of the descendant it would take.
    failing(monkeypatch, method, {child.pid if method == "uids" else grandchild.pid}, shape)
    assert family.preview([target], protected=()) == {target.pid: ()}


def test_the_tree_walk_takes_a_readable_descendant(child: subprocess.Popen[bytes]) -> None:
    # The control: the same walk, nothing injected, names the grandchild.
    target = identity_of(child.pid)
    assert target is not None
    (grandchild,) = psutil.Process(child.pid).children()
    assert family.preview([target], protected=()) == {target.pid: (Pid(grandchild.pid),)}
