"""Small types shared by the platform modules and everything above them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, NewType, final

Pid = NewType("Pid", int)


@final
@dataclass(frozen=True, slots=True)
class ProcessStart:
    """When a process started, as a stamp that stays equal for its whole life.

    Linux (either backend): seconds since boot (kernel start ticks / CLK_TCK). macOS:
    `kp_proc.p_starttime`, stored once at fork. Neither moves with the clock, unlike
    psutil's `create_time()`. `exited` is true for zombies: dead but unreaped.
    """

    started: float
    exited: bool


MemoryKind = Literal["footprint", "rss"]


@final
@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """What a process holds, labelled: on macOS its physical footprint (Metal buffers
    included, what Activity Monitor shows), elsewhere its resident set size."""

    kind: MemoryKind
    bytes: int


@final
@dataclass(frozen=True, slots=True)
class WiredMemory:
    """Machine-wide wired memory beside what live processes account for (macOS).

    Memory wired by a process that was hard-killed in the middle of GPU work can stay
    wired with no process left to own it; only a reboot frees it.
    """

    ram: int
    wired: int
    """host_statistics64's wire_count times the page size (psutil's `wired`)."""
    footprints: int
    """The sum of the physical footprints of the processes that could be read."""
    processes: int
    unreadable: int
    """Processes whose footprint could not be read (other users', without root)."""

    @property
    def unaccounted(self) -> int:
        return self.wired - self.footprints


ZOMBIE: Final = "zombie"
"""psutil's `STATUS_ZOMBIE`: dead, not yet reaped."""
DEAD: Final = "dead"
"""psutil's `STATUS_DEAD`."""


@final
@dataclass(frozen=True, slots=True)
class ProcessDetails:
    """What a sweep's snapshot reads about one process, in one pass.

    The first four always come together (one kinfo_proc sysctl on macOS, the stat file
    on Linux); each later detail is None where it could not be read.
    """

    ppid: int
    uid: int
    status: str
    """psutil's status word (`ZOMBIE`, "running", "sleeping", ...)."""
    create_time: float
    argv: tuple[str, ...] | None
    exe: str | None
    rss: int | None
    pgid: int | None
    refused: bool
    """A detail was refused as "no such process" although the first four were read:
    the process may be exiting (the caller asks the process table)."""
