"""How a runner ends once its worker is gone, and what its watchdog writes down of it:
`busy`, `begun`, `ended` and `watchdog` lines in the endings log (`records.endings`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
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


def record_begun(plan: EndingPlan, runner: ProcessIdentity, deadline: float) -> None:
    record(plan, runner, None, None, "its worker died", deadline=deadline)


def described(
    outcome: Outcome, after: float, gil: Gil, grace: float, raised: bool = False
) -> tuple[endings.How, float, str, endings.Step]:
    """How, when, why and by which step the runner ended; `raised`: `WorkerGone` was
    raised on its main thread (else it exited with none)."""
    step: endings.Step = "worker_gone" if raised else "exit"
    match outcome:
        case "clean":
            return "clean", after, "it exited by itself after its worker died", step
        case "shut down":
            why = "it ran its own shutdown and exited by itself"
            return "clean", after, why, step
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
