"""`notice_check`'s parts: the raw `struct sigaction` read and put back (this process's,
and a macOS-shaped one from a fake libc), what `reach` finds and does in each case,
by injection, what the watchdog is told, and the main thread's mask as read by
`system`. The whole, on real runners: tests/test_notice_in_the_way.py."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.watch import notice_check
from exo_orphan_guard.watch.notice_check import (
    BLOCKED,
    TAKEN_OVER,
    Armed,
    arm,
    handler_of,
    reach,
    read_action,
    said,
    write_action,
)

SPARE: signal.Signals = signal.SIGUSR2
"""A signal nothing in the test process uses: the one these tests take over."""
OURS = 0x7F00_1234_5678
THEIRS = 0x7F00_8765_4321


handled_numbers: list[int] = []


def handled(signal_number: int, frame: FrameType | None) -> None:
    handled_numbers.append(signal_number)


@pytest.fixture
def spare() -> Iterator[signal.Signals]:
    """SPARE with a Python handler of the test's, put back as it was afterwards."""
    before = signal.signal(SPARE, handled)
    handled_numbers.clear()
    try:
        yield SPARE
    finally:
        faulthandler.unregister(SPARE)
        signal.signal(SPARE, before)


def action(handler: int) -> bytes:
    return handler.to_bytes(ctypes.sizeof(ctypes.c_void_p), sys.byteorder) + bytes(24)


def test_faulthandler_takes_the_signal_below_python_and_reach_puts_it_back(
    spare: signal.Signals,
) -> None:
    armed = arm(spare, handled)
    assert armed.action is not None and handler_of(armed.action) != 0
    faulthandler.register(spare, file=open(os.devnull, "w"))  # noqa: SIM115  # faulthandler keeps it
    # Python does not see it: only the process's sigaction tells.
    assert signal.getsignal(spare) is handled
    now = read_action(spare)
    assert now is not None and handler_of(now) != handler_of(armed.action)
    did = reached(armed)
    assert did == ["tell o", f"interrupt {int(spare)}", "deliver", "deliver", "deliver"]
    back = read_action(spare)
    assert back is not None and handler_of(back) == handler_of(armed.action)
    # The signal reaches the Python handler again.
    os.kill(os.getpid(), spare)
    for _ in range(1000):
        if handled_numbers:
            break
    assert handled_numbers == [spare]


def test_nothing_in_the_way_still_gives_the_notice_without_a_signal_but_sends_none(
    spare: signal.Signals,
) -> None:
    assert reached(arm(spare, handled)) == [f"interrupt {int(spare)}"]


def reached(
    armed: Armed | None,
    *,
    read: Callable[[int], bytes | None] | None = None,
    write: Callable[[int, bytes], bool] | None = None,
    python_handler: Callable[[int], object] = signal.getsignal,
    main_blocks: Callable[[int], bool | None] = lambda _number: False,
) -> list[str]:
    """What `reach` did, in order: told the watchdog, gave the notice without a signal
    and with one, started sending it again (the sigaction's read and write are real
    unless given)."""
    did: list[str] = []
    reach(
        armed,
        deliver=lambda: did.append("deliver"),
        tell=lambda news: did.append(f"tell {news.decode()}"),
        entered=lambda: 0.0,
        beat=lambda: None,
        read=read,
        write=write,
        python_handler=python_handler,
        main_blocks=main_blocks,
        interrupt=lambda number: did.append(f"interrupt {int(number)}"),
        again_at=(0.0, 0.0),
    )
    return did


def test_a_failed_read_or_write_is_an_answer_not_an_exception() -> None:
    class Failing:
        def sigaction(self, signal_number: int, action: object, old: object, /) -> int:
            return -1

    assert read_action(signal.SIGUSR1, Failing()) is None
    assert not write_action(signal.SIGUSR1, action(OURS), Failing())


def fake_reach(
    armed: Armed | None,
    *,
    now: int | None = OURS,
    written: bool = True,
    blocks: bool | None = False,
    python_handler: object = handled,
) -> list[str]:
    """`reach` with every part faked: what it did, in order."""
    did: list[str] = []

    def write(signal_number: int, raw: bytes) -> bool:
        did.append(f"write {handler_of(raw):#x}")
        return written

    did.extend(
        reached(
            armed,
            read=lambda _number: None if now is None else action(now),
            write=write,
            python_handler=lambda _number: python_handler,
            main_blocks=lambda _number: blocks,
        )
    )
    return did


ARMED = Armed(signal.SIGUSR1, handled, action(OURS), blocked=False)
INTERRUPT = f"interrupt {int(signal.SIGUSR1)}"
PUT_BACK = f"write {OURS:#x}"


@pytest.mark.parametrize(
    ("armed", "faked", "did"),
    [
        pytest.param(ARMED, {}, [INTERRUPT], id="nothing-in-the-way"),
        pytest.param(
            ARMED,
            {"now": THEIRS},
            [PUT_BACK, "tell o", INTERRUPT, "deliver", "deliver", "deliver"],
            id="taken-over",
        ),
        pytest.param(
            ARMED,
            {"now": THEIRS, "written": False},
            [PUT_BACK, "tell x", INTERRUPT],
            id="taken-over-for-good",
        ),
        pytest.param(ARMED, {"now": None}, [INTERRUPT], id="unreadable-now"),
        pytest.param(
            Armed(signal.SIGUSR1, handled, None, blocked=False),
            {"now": THEIRS},
            [INTERRUPT],
            id="unreadable-when-armed",
        ),
        pytest.param(ARMED, {"blocks": True}, ["tell m", INTERRUPT], id="blocked"),
        pytest.param(
            Armed(signal.SIGUSR1, handled, action(OURS), blocked=True),
            {"blocks": None},
            ["tell m", INTERRUPT],
            id="blocked-when-armed-mask-unreadable-now",
        ),
        pytest.param(
            Armed(signal.SIGUSR1, handled, action(OURS), blocked=True),
            {"blocks": False},
            [INTERRUPT],
            id="blocked-when-armed-unblocked-since",
        ),
        pytest.param(
            Armed(signal.SIGUSR1, handled, action(OURS), blocked=True),
            {"now": THEIRS, "blocks": True},
            [PUT_BACK, "tell om", INTERRUPT, "deliver", "deliver", "deliver"],
            id="taken-over-and-blocked-when-armed",
        ),
        pytest.param(
            ARMED,
            {"now": THEIRS, "blocks": True},
            [PUT_BACK, "tell o", INTERRUPT, "deliver", "deliver", "deliver"],
            id="taken-over-the-other-handler-running",  # the kernel blocks it meanwhile
        ),
        pytest.param(
            ARMED, {"python_handler": signal.SIG_IGN}, ["tell p"], id="another-python-handler"
        ),
        pytest.param(None, {}, [], id="not-armed"),
    ],
)
def test_what_reach_finds_and_does(
    armed: Armed | None, faked: dict[str, object], did: list[str]
) -> None:
    """The watchdog is told first: a main thread told may exit at once."""
    assert fake_reach(armed, **faked) == did  # pyright: ignore[reportArgumentType]


def test_reach_never_raises_and_keeps_what_it_found() -> None:
    def broken(signal_number: int) -> bool | None:
        raise RuntimeError("injected")

    did = reached(
        ARMED,
        read=lambda _number: action(THEIRS),
        write=lambda _number, _raw: True,
        python_handler=lambda _number: handled,
        main_blocks=broken,
    )
    assert did == ["tell o", INTERRUPT, "deliver", "deliver", "deliver"]


def test_after_a_takeover_the_notice_goes_again_until_the_handler_is_entered() -> None:
    """faulthandler's handler, still dumping stacks when the signal comes again, has
    the main thread's `read` restarted once both handlers return: only a later signal
    interrupts it. Meanwhile the heartbeat goes on."""
    did: list[str] = []
    entries = iter([0.0, 0.0, float("inf")])
    reach(
        ARMED,
        deliver=lambda: did.append("deliver"),
        tell=lambda _news: None,
        entered=lambda: next(entries),
        beat=lambda: did.append("beat"),
        read=lambda _number: action(THEIRS),
        write=lambda _number, _raw: True,
        python_handler=lambda _number: handled,
        main_blocks=lambda _number: False,
        interrupt=lambda _number: None,
        again_at=(0.01, 0.02, 0.25, 0.5),
    )
    # The first, then one at 0.01 s and 0.02 s; entered by 0.25 s: beats in between,
    # one a 0.1 s at most.
    assert did[0] == "deliver" and did.count("deliver") == 3, did
    assert 3 <= did.count("beat") <= 6 and did[-1] == "beat", did


def test_arm_reads_the_main_threads_mask(spare: signal.Signals) -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {spare})
    try:
        assert arm(spare, handled).blocked
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert not arm(spare, handled).blocked


def test_a_block_counts_only_if_it_lasts() -> None:
    """The kernel blocks the signal on a thread while it runs the signal's C handler
    (seen here, the main thread preempted in it, while more notices were pending): a
    moment, which is not the program's block."""
    answers = iter([True, True, False])
    flapping = notice_check.main_thread_blocks(
        SPARE, lambda _thread, _signal: next(answers), steady=1.0
    )
    assert flapping is False
    reads: list[int] = []

    def always(thread: int, signal_number: int) -> bool:
        reads.append(thread)
        return True

    assert notice_check.main_thread_blocks(SPARE, always, steady=0.02)
    assert len(reads) > 1 and set(reads) == {threading.main_thread().native_id}
    assert notice_check.main_thread_blocks(SPARE, lambda _thread, _signal: None) is None


def test_what_the_watchdog_writes_of_it() -> None:
    assert said(b"", signal.SIGUSR1) == ""
    assert said(TAKEN_OVER + BLOCKED, signal.SIGUSR1) == (
        "; its notice signal SIGUSR1 had been taken over below Python "
        "(faulthandler.register?): put back, and sent again"
        "; its notice signal SIGUSR1 was blocked on its main thread: told without it "
        "(interrupt_main), which that thread takes once it runs Python"
    )
    assert all(said(news, signal.SIGUSR1) for news in notice_check.NEWS)
    assert len({news[0] for news in notice_check.NEWS}) == len(notice_check.NEWS)


def test_another_threads_mask_is_read_on_linux_only() -> None:
    """`system.thread_blocks_signal`: the Linux backend reads /proc; the portable one
    (macOS) cannot read another thread's mask, and says so with None."""
    ready, done = threading.Event(), threading.Event()
    natives: list[int] = []

    def blocking() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {SPARE})
        natives.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=blocking)
    thread.start()
    try:
        assert ready.wait(10)
        answers = (
            system.thread_blocks_signal(natives[0], SPARE),
            system.thread_blocks_signal(threading.get_native_id(), SPARE),
        )
    finally:
        done.set()
        thread.join()
    assert answers == ((True, False) if system.BACKEND == "linux" else (None, None))
