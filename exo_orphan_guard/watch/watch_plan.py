"""Which parts of the watch to arm, and how the runner ends: pure, so that every
strategy is tested against made-up capabilities (tests/test_watch_plan.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, final

from ..system import settings
from .waiters import WaiterName

ParentDeathSignal = Literal[
    "safe", "spawned-by-other-thread", "not-worker-child", "unknown", "unsupported"
]

_PARENT_DEATH_SIGNAL_REASONS: Final[Mapping[ParentDeathSignal, str]] = {
    "safe": "",
    "spawned-by-other-thread": (
        "the worker spawned this runner from a thread other than its main thread, "
        "and PR_SET_PDEATHSIG would fire when that thread exits"
    ),
    "not-worker-child": "this runner's parent is not the worker",
    "unknown": "the kernel does not say which worker thread spawned this runner",
    "unsupported": "this OS has no PR_SET_PDEATHSIG",
}

EndingKind = Literal["clean", "kill"]


@final
@dataclass(frozen=True, slots=True)
class WatchCapabilities:
    waiters: tuple[WaiterName, ...]
    """Usable waiters, preferred first."""
    parent_death_signal: ParentDeathSignal
    can_fork: bool
    main_thread: bool = True
    """Whether the runner arms its watch from its main thread (only there can Python
    install the signal handler the clean ending starts from)."""


@final
@dataclass(frozen=True, slots=True)
class WatchPlan:
    thread_chain: tuple[WaiterName, ...]
    """Waiters for a watch thread inside the runner; empty: no thread."""
    parent_death_signal: bool
    watchdog: bool
    notes: tuple[str, ...] = ()
    ending: EndingKind = "kill"
    """clean: WorkerGone on the main thread, the watchdog kills only a wedged or hanging
    runner; kill: the runner's group is killed at once (PR_SET_PDEATHSIG with SIGKILL)."""
    why_kill: str = ""
    """Why the ending is `kill`, for the log and the endings record."""

    def describe(self) -> str:
        parts: list[str] = []
        if self.thread_chain:
            parts.append(f"{self.thread_chain[0]} thread")
        if self.parent_death_signal:
            parts.append("PR_SET_PDEATHSIG")
        if self.watchdog:
            parts.append("watchdog process")
        mechanisms = " + ".join(parts) or "nothing"
        if self.ending == "clean":
            return f"{mechanisms}; clean ending"
        return f"{mechanisms}; killed at once" if self.why_kill else mechanisms


def plan_watch(
    strategy: settings.Strategy, capabilities: WatchCapabilities, grace: float
) -> WatchPlan:
    """Which mechanisms to arm, and how the runner ends. `auto` arms every one that is
    safe here: a thread for the common case, PR_SET_PDEATHSIG and the watchdog for a
    runner holding the GIL. The ending is clean when there is a grace, a watchdog to
    bound it, and the main thread to start it from."""
    mechanisms = _mechanisms(strategy, capabilities)
    if grace <= 0:
        why = f"{settings.GRACE_ENV}=0"
    elif not mechanisms.watchdog:
        why = "no watchdog process to bound a clean ending"
    elif not capabilities.main_thread:
        why = "guard_runner() was not called from the main thread"
    else:
        return dataclasses.replace(mechanisms, ending="clean")
    if mechanisms.watchdog:
        # PR_SET_PDEATHSIG would be SIGKILL here and take the runner before anything
        # walked its tree: what it started outside its group would be init's, out of
        # reach. The watchdog walks first, then kills, within milliseconds.
        mechanisms = dataclasses.replace(mechanisms, parent_death_signal=False)
    return dataclasses.replace(mechanisms, why_kill=why)


def _mechanisms(strategy: settings.Strategy, capabilities: WatchCapabilities) -> WatchPlan:
    safe_signal = capabilities.parent_death_signal == "safe"
    signal_note = _PARENT_DEATH_SIGNAL_REASONS[capabilities.parent_death_signal]
    auto = WatchPlan(capabilities.waiters, safe_signal, capabilities.can_fork)
    match strategy:
        case "auto":
            return auto
        case "pidfd" | "kqueue" | "sentinel" | "poll":
            if strategy in capabilities.waiters:
                return WatchPlan((strategy,), parent_death_signal=False, watchdog=False)
            return _with_note(auto, f"the {strategy} waiter is not usable here: using auto")
        case "pdeathsig":
            if safe_signal:
                return WatchPlan((), parent_death_signal=True, watchdog=False)
            fallback = WatchPlan((), False, True) if capabilities.can_fork else auto
            return _with_note(
                fallback,
                f"PR_SET_PDEATHSIG is not safe here ({signal_note}): using {fallback.describe()}",
            )
        case "watchdog":
            if capabilities.can_fork:
                return WatchPlan((), parent_death_signal=False, watchdog=True)
            return _with_note(auto, "cannot fork a watchdog here: using auto")


def _with_note(plan: WatchPlan, note: str) -> WatchPlan:
    return WatchPlan(plan.thread_chain, plan.parent_death_signal, plan.watchdog, (note,))
