"""How a runner ends once its worker is gone, and what its watchdog writes down of it:
`busy`, `begun`, `ended` and `watchdog` lines in the endings log (`records.endings`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, final

from ..records import endings
from ..records.endings import Ending
from ..system.identity import ProcessIdentity

Outcome = Literal["clean", "shut down", "busy", "hanging"]
Gil = Literal["held", "free"]


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
    notice: int | None = None
    """Write end of the pipe whose byte wakes the runner's heartbeat thread."""
    busy_wait: float = 0.0
    """From the notice, how long a runner busy in native code is waited for (0: the
    wedge bound, `WEDGE_SECONDS`)."""


@final
@dataclass(frozen=True, slots=True)
class Steps:
    """What the runner told its watchdog of the steps of its ending."""

    handed_over: bool = False
    """Its program's own Shutdown was handed to it."""
    taken: bool = False
    """Its program's code took that Shutdown."""
    raised: bool = False
    """`WorkerGone` was raised on its main thread."""

    def learn(self, handed_over: bool, taken: bool, raised: bool) -> Steps:
        return replace(
            self,
            handed_over=self.handed_over or handed_over,
            taken=self.taken or taken,
            raised=self.raised or raised,
        )

    def step(self) -> endings.Step:
        """Which step ended a runner that exited by itself. A Shutdown handed over and
        no WorkerGone: the Shutdown (taken between two looks, if none saw it)."""
        if self.raised:
            return "worker_gone"
        return "shutdown" if self.handed_over or self.taken else "exit"


def record_begun(plan: EndingPlan, runner: ProcessIdentity, deadline: float) -> None:
    record(plan, runner, None, None, "its worker died", deadline=deadline)


def described(
    outcome: Outcome, after: float, gil: Gil, grace: float, steps: Steps = Steps()
) -> tuple[endings.How, float, str, endings.Step]:
    match outcome:
        case "clean" | "shut down" if steps.step() == "shutdown":
            return "clean", after, "it took its own Shutdown and exited by itself", "shutdown"
        case "clean" | "shut down" if steps.handed_over and steps.raised:
            why = "it did not take its own Shutdown in time; WorkerGone was raised, and it exited"
            return "clean", after, why, "worker_gone"
        case "clean":
            return "clean", after, "it exited by itself after its worker died", steps.step()
        case "shut down":
            why = "it ran its own shutdown and exited by itself"
            return "clean", after, why, steps.step()
        case "busy":
            why = f"busy in native code for {after:.1f} s (GIL {gil})"
            return "killed", after, why, "busy_wait"
        case "hanging":
            why = f"its clean ending did not finish within the {grace:g} s grace"
            return "killed", after, why, "grace"


def record(
    plan: EndingPlan,
    runner: ProcessIdentity,
    how: endings.How | None,
    after: float | None,
    why: str,
    deadline: float | None = None,
    *,
    event: endings.Event | None = None,
    at: float | None = None,
    gil: Gil | None = None,
    busy_wait: float | None = None,
    step: endings.Step | None = None,
) -> None:
    """An `ended` line (`how` given), a `begun` one (with its `deadline`), or the
    `event` named (`busy`, with `gil` and `busy_wait`; `watchdog`)."""
    if plan.endings_path is not None:
        endings.append(
            plan.endings_path,
            Ending(
                event=event or ("begun" if how is None else "ended"),
                pid=runner.pid,
                started=runner.started,
                boot_id=plan.boot_id,
                at=time.time() if at is None else at,
                by=plan.by,
                how=how,
                after_seconds=after,
                why=why,
                deadline=deadline,
                labels=plan.labels,
                gil=gil,
                busy_wait=busy_wait,
                step=step,
            ),
        )
