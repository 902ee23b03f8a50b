"""`plan_watch` is pure: every strategy against made-up capabilities."""

from __future__ import annotations

import pytest

from exo_orphan_guard.watch.runner_watch import (
    ParentDeathSignal,
    WatchCapabilities,
    WatchPlan,
    plan_watch,
)

LINUX = WatchCapabilities(("pidfd", "sentinel", "poll"), "safe", can_fork=True)
MACOS = WatchCapabilities(("kqueue", "sentinel", "poll"), "unsupported", can_fork=True)
NO_FORK = WatchCapabilities(("poll",), "unsupported", can_fork=False)


def test_auto_on_linux_arms_thread_signal_and_watchdog() -> None:
    assert plan_watch("auto", LINUX) == WatchPlan(("pidfd", "sentinel", "poll"), True, True)


def test_auto_on_macos_arms_kqueue_thread_and_watchdog() -> None:
    assert plan_watch("auto", MACOS) == WatchPlan(("kqueue", "sentinel", "poll"), False, True)


@pytest.mark.parametrize(
    "safety", ["spawned-by-other-thread", "not-worker-child", "unknown", "unsupported"]
)
def test_auto_never_arms_an_unsafe_parent_death_signal(safety: ParentDeathSignal) -> None:
    capabilities = WatchCapabilities(("pidfd", "poll"), safety, can_fork=True)
    plan = plan_watch("auto", capabilities)
    assert not plan.parent_death_signal and plan.watchdog


def test_single_waiter_strategies_arm_only_that_thread() -> None:
    assert plan_watch("sentinel", LINUX) == WatchPlan(("sentinel",), False, False)
    assert plan_watch("kqueue", MACOS) == WatchPlan(("kqueue",), False, False)


def test_unavailable_waiter_falls_back_to_auto_and_says_so() -> None:
    plan = plan_watch("kqueue", LINUX)
    assert plan.thread_chain == LINUX.waiters and plan.watchdog
    assert plan.notes and "kqueue" in plan.notes[0]


def test_pdeathsig_alone_when_safe() -> None:
    assert plan_watch("pdeathsig", LINUX) == WatchPlan((), True, False)


def test_pdeathsig_spawned_from_another_thread_hands_over_to_the_watchdog() -> None:
    capabilities = WatchCapabilities(("pidfd",), "spawned-by-other-thread", can_fork=True)
    plan = plan_watch("pdeathsig", capabilities)
    assert (plan.parent_death_signal, plan.watchdog) == (False, True)
    assert "thread" in plan.notes[0]


def test_pdeathsig_without_fork_falls_back_to_the_thread() -> None:
    plan = plan_watch("pdeathsig", NO_FORK)
    assert plan.thread_chain == ("poll",) and not plan.watchdog and not plan.parent_death_signal


def test_watchdog_alone_and_its_fallback() -> None:
    assert plan_watch("watchdog", MACOS) == WatchPlan((), False, True)
    assert plan_watch("watchdog", NO_FORK).thread_chain == ("poll",)


def test_describe_names_what_is_armed() -> None:
    assert (
        plan_watch("auto", LINUX).describe() == "pidfd thread + PR_SET_PDEATHSIG + watchdog process"
    )
