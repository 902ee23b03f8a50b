"""Small types shared by the platform modules and everything above them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType, final

Pid = NewType("Pid", int)


@final
@dataclass(frozen=True, slots=True)
class ProcessStart:
    """When a process started, as a stamp that stays equal for its whole life.

    Linux: seconds since boot (kernel start ticks / CLK_TCK), immune to wall-clock
    steps, unlike psutil's `create_time()`. Elsewhere: psutil's `create_time()`, which
    the kernel stores once at fork. `exited` is true for zombies: dead but unreaped.
    """

    started: float
    exited: bool
