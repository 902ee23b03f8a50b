from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from exo_orphan_guard import waiters
from exo_orphan_guard.identity import ProcessIdentity, current_identity, identity_of


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
) -> float:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (wait(target), done.set()), daemon=True)
    thread.start()
    assert not done.wait(0.3), "returned while the process was alive"
    killed_at = time.monotonic()
    process.kill()
    assert done.wait(2.0), "did not return after the process died"
    return time.monotonic() - killed_at


@pytest.mark.skipif(not waiters.can_use_pidfd(), reason="needs pidfd_open (Linux >= 5.3)")
def test_pidfd_waiter_wakes_on_exit_without_reaping(
    sleeper: tuple[subprocess.Popen[bytes], ProcessIdentity],
) -> None:
    assert _returns_after_kill(waiters.wait_pidfd, *sleeper) < 0.5


def test_poll_waiter_wakes_within_its_interval(
    sleeper: tuple[subprocess.Popen[bytes], ProcessIdentity],
) -> None:
    latency = _returns_after_kill(waiters.wait_poll, *sleeper)
    assert latency < waiters.POLL_INTERVAL_SECONDS * 3


@pytest.mark.parametrize("name", ["pidfd", "poll"])
def test_a_reused_pid_counts_as_gone_at_once(name: waiters.WaiterName) -> None:
    if name == "pidfd" and not waiters.can_use_pidfd():
        pytest.skip("needs pidfd_open (Linux >= 5.3)")
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
