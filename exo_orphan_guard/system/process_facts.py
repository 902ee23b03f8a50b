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


Stamp = int
"""What a process listing says of a pid, changing whenever the pid changes hands: the
inode of /proc/<pid> on Linux (each process that holds the pid gets its own), the
start time on macOS. Only ever compared with another stamp of the same listing call."""


@final
@dataclass(frozen=True, slots=True)
class CreationMark:
    """Where this pid namespace's pid allocator stands (Linux, read in one go).

    The kernel hands pids out in turn, skipping those in use, and wraps at `pid_max`:
    so a process created since an earlier mark holds a pid after that mark's
    `last_pid`, up to this one's, unless the allocator went round whole (more tasks
    created than there are free pids) or was set back (`ns_last_pid`, which only a
    privileged process such as CRIU may write).
    """

    last_pid: int
    """The pid (or thread id) handed out last in this namespace (/proc/loadavg)."""
    forks: int
    """Processes and threads created since boot, machine-wide (/proc/stat
    `processes`): it never goes back."""
    tasks: int
    """Processes and threads alive, machine-wide (/proc/loadavg)."""
    pid_max: int


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


Image = tuple[object, ...]
"""What shows which program a process runs, equal only while it runs the same one:
a new one after each exec (`ProcessState.image`)."""


@final
@dataclass(frozen=True, slots=True)
class ProcessState:
    """What may change while a process lives, read afresh in one pass (`/proc/<pid>/stat`
    on Linux) so that what cannot change is read once per image (the guardian's scans).

    `image` changes when the process execs: on Linux the addresses exec randomizes
    (stack, arguments, environment) with its executable and command line; elsewhere
    its executable and command line (macOS keeps the pid and the start across an exec).
    None: nothing to tell an exec by (another user's process, a zombie)."""

    start: ProcessStart
    ppid: int
    status: str
    pgid: int | None
    rss: int | None
    memory: MemoryUsage | None
    image: Image | None
    ignores_sigint: bool | None = None
    """As `ignores_signal(pid, SIGINT)` answers, where the same pass shows it (Linux)."""
