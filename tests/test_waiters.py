from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import final

import psutil
import pytest

from exo_orphan_guard.system.identity import ProcessIdentity, current_identity, identity_of
from exo_orphan_guard.watch import waiters


@pytest.fixture
def sleeper() -> Iterator[tuple[subprocess.Popen[bytes], ProcessIdentity]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = identity_of(process.pid)
    assert identity is not None
    yield process, identity
    process.kill()
    process.wait()


def _returns_after_kill(
    wait: Callable[[ProcessIdentity], None],
    process: subprocess.Popen[bytes],
    target: ProcessIdentity,
) -> None:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (wait(target), done.set()), daemon=True)
    thread.start()
    assert not done.wait(0.3), "returned while the process was alive"
    process.kill()
    assert done.wait(10.0), "did not return after the process died"


@pytest.mark.skipif(
    not waiters.can_use_pidfd(), reason="pidfd: the Linux backend on Linux >= 5.3 only"
)
def test_pidfd_waiter_wakes_on_exit_without_reaping(
    sleeper: tuple[subprocess.Popen[bytes], ProcessIdentity],
) -> None:
    _returns_after_kill(waiters.wait_pidfd, *sleeper)
    # Woke at the exit: our child, unreaped until the fixture waits for it.
    assert psutil.Process(sleeper[1].pid).status() == psutil.STATUS_ZOMBIE


def test_poll_waiter_wakes_once_the_process_is_gone(
    sleeper: tuple[subprocess.Popen[bytes], ProcessIdentity],
) -> None:
    # How soon (about its interval) is `make bench`'s watch section, portable rows.
    _returns_after_kill(waiters.wait_poll, *sleeper)


@pytest.mark.parametrize("name", ["pidfd", "poll"])
def test_a_reused_pid_counts_as_gone_at_once(name: waiters.WaiterName) -> None:
    if name == "pidfd" and not waiters.can_use_pidfd():
        pytest.skip("pidfd: the Linux backend on Linux >= 5.3 only")
    me = current_identity()
    impostor = ProcessIdentity(me.pid, me.started - 1.0)  # our pid, someone else's start
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (waiters.WAITERS[name](impostor), done.set()), daemon=True
    )
    thread.start()
    assert done.wait(1.0), "waited on a live process that only shares the dead one's pid"


def test_sentinel_waiter_is_unavailable_outside_a_multiprocessing_child() -> None:
    assert not waiters.can_use_sentinel(current_identity())
    with pytest.raises(waiters.WaiterUnavailableError):
        waiters.wait_sentinel(current_identity())


def test_kqueue_is_only_offered_off_linux() -> None:
    assert waiters.can_use_kqueue() == (
        sys.platform != "linux" and hasattr(__import__("select"), "kqueue")
    )


def test_usable_waiters_order_puts_poll_last() -> None:
    usable = waiters.usable_waiters(current_identity())
    assert usable[-1] == "poll"
    if sys.platform == "linux" and waiters.can_use_pidfd():
        assert usable[0] == "pidfd"


def test_dispatcher_skips_unavailable_and_spurious_waiters(
    sleeper: tuple[subprocess.Popen[bytes], ProcessIdentity],
) -> None:
    process, target = sleeper
    calls: list[str] = []

    def unavailable(_: ProcessIdentity) -> None:
        calls.append("pidfd")
        raise waiters.WaiterUnavailableError("injected")

    def spurious(_: ProcessIdentity) -> None:
        calls.append("sentinel")  # wakes while the process is alive

    def real(identity: ProcessIdentity) -> None:
        calls.append("kqueue")
        process.kill()
        process.wait()
        waiters.wait_poll(identity)

    injected: dict[waiters.WaiterName, Callable[[ProcessIdentity], None]] = {
        "pidfd": unavailable,
        "sentinel": spurious,
        "kqueue": real,
        "poll": waiters.wait_poll,
    }
    assert waiters.wait_for_exit(target, ("pidfd", "sentinel", "kqueue"), injected) == "kqueue"
    assert calls == ["pidfd", "sentinel", "kqueue"]


# --- kqueue NOTE_EXIT, by injection: Linux has no kqueue, but a pidfd fires at the same
# moment (exit, not reap), so the waiter's own logic runs against real processes.

REAP_AFTER_SECONDS = 1.5
LATE_REAPING_PARENT = """
import os, select, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
select.select([os.pidfd_open(child.pid)], [], [])
time.sleep(float(sys.argv[1]))
child.wait()
"""


@final
class PidfdKqueue:
    """`select.kqueue` with EVFILT_PROC/NOTE_EXIT events, played by pidfds."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def control(
        self, changelist: Iterable[object] | None, maxevents: int, timeout: float | None = None, /
    ) -> list[object]:
        if changelist is not None:
            for pid in changelist:
                assert isinstance(pid, int)
                self.fds.append(os.pidfd_open(pid))  # ProcessLookupError, like ESRCH
            return []
        assert maxevents == 1
        ready, _, _ = select.select(self.fds, [], [], timeout)
        return list(ready)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def injected_kqueue(target: ProcessIdentity) -> None:
    waiters.wait_kqueue(target, open_queue=PidfdKqueue, exit_event=lambda pid: pid)


@pytest.fixture
def late_reaped() -> Iterator[tuple[subprocess.Popen[str], ProcessIdentity]]:
    """A process that is not our child, whose parent reaps it 1.5 s after it dies."""
    parent = subprocess.Popen(
        [sys.executable, "-c", LATE_REAPING_PARENT, str(REAP_AFTER_SECONDS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    identity = identity_of(int(parent.stdout.readline()))
    assert identity is not None
    yield parent, identity
    with contextlib.suppress(ProcessLookupError):
        os.kill(identity.pid, signal.SIGKILL)
    parent.kill()
    parent.wait()


def _kill_and_time(
    wait: Callable[[ProcessIdentity], object], target: ProcessIdentity
) -> tuple[float, bool]:
    """Seconds from SIGKILL to `wait` returning, and whether the target was a zombie then."""
    done = threading.Event()
    thread = threading.Thread(target=lambda: (wait(target), done.set()), daemon=True)
    thread.start()
    assert not done.wait(0.3), "returned while the process was alive"
    killed_at = time.monotonic()
    os.kill(target.pid, signal.SIGKILL)
    assert done.wait(REAP_AFTER_SECONDS + 2.0)
    latency = time.monotonic() - killed_at
    try:
        zombie = psutil.Process(target.pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        zombie = False
    return latency, zombie


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the stand-in kqueue needs pidfds")
def test_kqueue_waiter_fires_at_exit_not_at_reap(
    late_reaped: tuple[subprocess.Popen[str], ProcessIdentity],
) -> None:
    _, target = late_reaped
    latency, zombie = _kill_and_time(injected_kqueue, target)
    assert latency < REAP_AFTER_SECONDS and zombie
    assert waiters.confirmed_gone(target)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the stand-in kqueue needs pidfds")
def test_kqueue_waiter_returns_at_once_for_a_process_already_gone(
    late_reaped: tuple[subprocess.Popen[str], ProcessIdentity],
) -> None:
    parent, target = late_reaped
    os.kill(target.pid, signal.SIGKILL)
    parent.wait()  # reaped: registering the exit event fails like ESRCH
    started = time.monotonic()
    injected_kqueue(target)
    assert time.monotonic() - started < 1.0  # at once: not waiting for an exit event


def test_psutil_wait_on_a_non_child_returns_only_at_reap(
    late_reaped: tuple[subprocess.Popen[str], ProcessIdentity],
) -> None:
    """Why the kqueue waiter is not psutil's `Process.wait()` (this project's old one)."""
    _, target = late_reaped
    process = psutil.Process(target.pid)
    latency, zombie = _kill_and_time(lambda _: process.wait(), target)
    assert latency > REAP_AFTER_SECONDS - 0.2 and not zombie
