"""`plan_watch` is pure: every strategy against made-up capabilities.

The mechanisms are planned the same whatever the grace; the first tests plan with
grace 0 (kill at once), the last ones the clean ending."""

from __future__ import annotations

import dataclasses

import pytest

from exo_orphan_guard.system.settings import Strategy
from exo_orphan_guard.watch.waiters import WaiterName
from exo_orphan_guard.watch.watch_plan import (
    ParentDeathSignal,
    WatchCapabilities,
    WatchPlan,
    plan_watch,
)

LINUX = WatchCapabilities(("pidfd", "sentinel", "poll"), "safe", can_fork=True)
MACOS = WatchCapabilities(("kqueue", "sentinel", "poll"), "unsupported", can_fork=True)
NO_FORK = WatchCapabilities(("poll",), "unsupported", can_fork=False)
KILL = 0.0
GRACE = 10.0


def at_once(
    thread_chain: tuple[WaiterName, ...], parent_death_signal: bool, watchdog: bool
) -> WatchPlan:
    """The plan with grace 0: these mechanisms, and the tree killed at once."""
    return WatchPlan(
        thread_chain, parent_death_signal, watchdog, why_kill="EXO_ORPHAN_GUARD_GRACE=0"
    )


def test_auto_on_linux_arms_thread_and_watchdog_and_no_killing_parent_death_signal() -> None:
    """With grace 0 PR_SET_PDEATHSIG would be SIGKILL, and kill the runner before the
    watchdog walked its tree (what it started outside its group would be left)."""
    assert plan_watch("auto", LINUX, KILL) == at_once(("pidfd", "sentinel", "poll"), False, True)


def test_auto_on_macos_arms_kqueue_thread_and_watchdog() -> None:
    assert plan_watch("auto", MACOS, KILL) == at_once(("kqueue", "sentinel", "poll"), False, True)


@pytest.mark.parametrize(
    "safety", ["spawned-by-other-thread", "not-worker-child", "unknown", "unsupported"]
)
def test_auto_never_arms_an_unsafe_parent_death_signal(safety: ParentDeathSignal) -> None:
    capabilities = WatchCapabilities(("pidfd", "poll"), safety, can_fork=True)
    plan = plan_watch("auto", capabilities, KILL)
    assert not plan.parent_death_signal and plan.watchdog


def test_single_waiter_strategies_arm_only_that_thread() -> None:
    assert plan_watch("sentinel", LINUX, KILL) == at_once(("sentinel",), False, False)
    assert plan_watch("kqueue", MACOS, KILL) == at_once(("kqueue",), False, False)


def test_unavailable_waiter_falls_back_to_auto_and_says_so() -> None:
    plan = plan_watch("kqueue", LINUX, KILL)
    assert plan.thread_chain == LINUX.waiters and plan.watchdog
    assert plan.notes and "kqueue" in plan.notes[0]


def test_pdeathsig_alone_when_safe() -> None:
    assert plan_watch("pdeathsig", LINUX, KILL) == at_once((), True, False)


def test_pdeathsig_spawned_from_another_thread_hands_over_to_the_watchdog() -> None:
    capabilities = WatchCapabilities(("pidfd",), "spawned-by-other-thread", can_fork=True)
    plan = plan_watch("pdeathsig", capabilities, KILL)
    assert (plan.parent_death_signal, plan.watchdog) == (False, True)
    assert "thread" in plan.notes[0]


def test_pdeathsig_without_fork_falls_back_to_the_thread() -> None:
    plan = plan_watch("pdeathsig", NO_FORK, KILL)
    assert plan.thread_chain == ("poll",) and not plan.watchdog and not plan.parent_death_signal


def test_watchdog_alone_and_its_fallback() -> None:
    assert plan_watch("watchdog", MACOS, KILL) == at_once((), False, True)
    assert plan_watch("watchdog", NO_FORK, KILL).thread_chain == ("poll",)


def test_describe_names_what_is_armed() -> None:
    assert plan_watch("auto", LINUX, GRACE).describe() == (
        "pidfd thread + PR_SET_PDEATHSIG + watchdog process; clean ending"
    )
    assert plan_watch("auto", LINUX, KILL).describe() == (
        "pidfd thread + watchdog process; killed at once"
    )


# --- how the runner ends -------------------------------------------------------------


@pytest.mark.parametrize("capabilities", [LINUX, MACOS])
@pytest.mark.parametrize("strategy", ["auto", "watchdog"])
def test_with_a_grace_and_a_watchdog_the_ending_is_clean(
    capabilities: WatchCapabilities, strategy: Strategy
) -> None:
    with_grace = plan_watch(strategy, capabilities, GRACE)
    assert with_grace.ending == "clean" and not with_grace.why_kill
    # The same mechanisms as without one, but the killing PR_SET_PDEATHSIG (a
    # watchdog walks the tree and kills instead): only the ending differs.
    without = plan_watch(strategy, capabilities, KILL)
    assert without.watchdog and not without.parent_death_signal
    assert (
        dataclasses.replace(
            with_grace, ending="kill", why_kill=without.why_kill, parent_death_signal=False
        )
        == without
    )


def test_grace_zero_kills_at_once_and_says_why() -> None:
    plan = plan_watch("auto", LINUX, KILL)
    assert plan.ending == "kill" and plan.why_kill == "EXO_ORPHAN_GUARD_GRACE=0"


@pytest.mark.parametrize("strategy", ["pidfd", "sentinel", "poll", "pdeathsig"])
def test_without_a_watchdog_nothing_bounds_a_clean_ending_so_it_kills(strategy: Strategy) -> None:
    plan = plan_watch(strategy, LINUX, GRACE)
    assert not plan.watchdog and plan.ending == "kill" and "watchdog" in plan.why_kill


def test_without_fork_auto_kills() -> None:
    plan = plan_watch("auto", NO_FORK, GRACE)
    assert plan.ending == "kill" and plan.thread_chain == ("poll",)


def test_off_the_main_thread_no_handler_can_be_installed_so_it_kills() -> None:
    capabilities = dataclasses.replace(LINUX, main_thread=False)
    plan = plan_watch("auto", capabilities, GRACE)
    assert plan.ending == "kill" and "main thread" in plan.why_kill
