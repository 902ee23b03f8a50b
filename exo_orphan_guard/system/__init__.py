"""One interface to the operating system; the module behind it is the backend.

`linux` reads /proc and calls prctl (auto on Linux). `portable` is psutil and the
standard library only: what macOS and the BSDs run, and what
`EXO_ORPHAN_GUARD_BACKEND=portable` forces on Linux so that CI runs the Mac's code.

The interface is the functions below, named here only: `backend` finds the module
that answers each one (`_linux`, `_darwin`, then `_posix`, which answers them all).
The backend loads on the first call (the function found then takes the declared
one's place here): `settings`, `once` and `process_facts` import without it, so
`exo-orphan-guard --version` and the CLI's argument parsing start without psutil.

Errors, for every call: an answer, never an exception, with one exception.
- What cannot be told here (the OS does not offer it, the process is gone, a read
  failed) is None; a list or an iterator holds what could be read. `False` and an
  empty set are answers, never a stand-in for "unknown".
- `PermissionError` is the only exception that leaves `system`, and only from the
  calls about one process that answer None for *gone* (`read_start`, `parent_pid`,
  `environment_value`, `process_details`): it means the process exists but cannot be
  read, which no caller may take for gone.
- `wired_memory`, behind a doctor line that explains itself, answers why macOS's
  figures could not be read as a string.

psutil is imported nowhere else in the package (a `forbidden` contract, `make lint`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Literal, ParamSpec, TypeVar, cast

from .process_facts import (
    CreationMark,
    MemoryUsage,
    Pid,
    ProcessDetails,
    ProcessStart,
    ProcessState,
    Stamp,
    WiredMemory,
)

BackendName = Literal["linux", "portable"]
if TYPE_CHECKING:
    BACKEND: BackendName
    """Which backend answers: `linux` or `portable` (loads it)."""

P = ParamSpec("P")
R = TypeVar("R")
_declared: dict[str, Callable[..., object]] = {}


def __getattr__(name: str) -> object:
    if name != "BACKEND":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import backend

    globals()[name] = backend.BACKEND
    return backend.BACKEND


def interface() -> dict[str, Callable[..., object]]:
    """The calls below by name, as declared (the backend's functions answer them)."""
    return dict(_declared)


def _backed(declared: Callable[P, R]) -> Callable[P, R]:
    """Declare a call: its signature and its answer. The body never runs: the first
    call finds the backend's function, which takes the declared one's place."""
    name = declared.__name__
    _declared[name] = declared

    @functools.wraps(declared)
    def first_call(*args: P.args, **kwargs: P.kwargs) -> R:
        from . import backend

        found = cast("Callable[P, R]", backend.implementation(name))
        if globals().get(name) is first_call:  # not while a test stands in for it
            globals()[name] = found
        return found(*args, **kwargs)

    return first_call


# The process's own start, parent, state and environment.


@_backed
def read_start(pid: int) -> ProcessStart | None:
    """When `pid` started (stable for its life) and whether it has exited (a zombie).
    None: gone. PermissionError: it exists but cannot be read."""
    raise NotImplementedError


@_backed
def parent_pid(pid: int) -> int | None:
    """None: gone. PermissionError: it exists but cannot be read."""
    raise NotImplementedError


@_backed
def environment_value(pid: int, name: str) -> str | None:
    """`name` in the environment `pid` started with. None: unset, or gone.
    PermissionError: the environment cannot be read (it may be set)."""
    raise NotImplementedError


@_backed
def process_details(pid: int) -> ProcessDetails | None:
    """What a sweep's snapshot needs of `pid`, in one pass. None: refused as no such
    process (exiting: ask `read_start`). PermissionError: it cannot be read."""
    raise NotImplementedError


@_backed
def process_state(pid: int) -> ProcessState | None:
    """What may change while `pid` lives (parent, state, group, memory) and a stamp of
    the program it runs (`ProcessState.image`), in one cheap pass. None: not read
    cleanly (gone, refused, unreadable): ask `process_details`, which tells which."""
    raise NotImplementedError


@_backed
def effective_uid(pid: int) -> int | None:
    """The user a process runs as, for the sweep's same-user rule."""
    raise NotImplementedError


@_backed
def owner_and_argv(pid: int) -> tuple[int, tuple[str, ...]] | None:
    """Its effective uid and command line, read together."""
    raise NotImplementedError


@_backed
def exe_and_argv(pid: int) -> tuple[str | None, tuple[str, ...]] | None:
    """Its executable (None if that alone cannot be read) and command line."""
    raise NotImplementedError


@_backed
def thread_count(pid: int) -> int | None:
    """Threads still there (Linux counts a zombie's until each has exited)."""
    raise NotImplementedError


@_backed
def stuck_state(pid: int) -> str | None:
    """'D' (Linux) or 'U' (macOS) for a process that even SIGKILL waits for; '?' where
    macOS's `ps` could not inspect it. None: not known to be stuck."""
    raise NotImplementedError


@_backed
def is_exiting(pid: int) -> bool | None:
    """Whether the process is on its way out: on Linux a SIGKILL pending, on macOS `E`
    among `ps`'s flags without `U`. Tearing a process down can take seconds on a loaded
    machine. None: cannot tell here (the engine then waits as for one on its way out)."""
    raise NotImplementedError


@_backed
def ignores_signal(pid: int, signal_number: int) -> bool | None:
    """Whether the process ignores the signal (SIG_IGN), as a spawn child of a
    process started in the background from a script ignores SIGINT where its parent
    set no handler first; None where it cannot be read (only Linux shows another
    process's dispositions)."""
    raise NotImplementedError


@_backed
def is_stopped(pid: int) -> bool | None:
    """Whether it is stopped (SIGSTOP), as a sweep's freeze leaves it."""
    raise NotImplementedError


@_backed
def memory_usage(pid: int) -> MemoryUsage | None:
    """Physical footprint on macOS (Metal buffers included), resident set elsewhere."""
    raise NotImplementedError


@_backed
def pipes_visible() -> bool:
    """Whether `pipe_inodes` can answer here (Linux)."""
    raise NotImplementedError


@_backed
def pipe_inodes(pid: int) -> frozenset[int] | None:
    """The pipes `pid` holds open, by inode."""
    raise NotImplementedError


@_backed
def mapped_files(pid: int) -> frozenset[str] | None:
    """The files `pid` has mapped (its executable, the shared libraries and extension
    modules it loaded), by path; None where they cannot be read (gone, another user's,
    or an OS that does not say)."""
    raise NotImplementedError


# Trees, groups and the whole process table.


@_backed
def child_pids(pid: int) -> list[Pid]:
    """Its children."""
    raise NotImplementedError


@_backed
def descendants(pid: int) -> list[Pid]:
    """Children, grandchildren, ...: each pid once, parents before their children."""
    raise NotImplementedError


@_backed
def process_group(pid: int) -> int | None:
    """The process group `pid` is in."""
    raise NotImplementedError


@_backed
def group_members(groups: Collection[int]) -> list[Pid]:
    """Processes whose process group is one of `groups` (an unreadable one is not)."""
    raise NotImplementedError


@_backed
def iter_command_lines() -> Iterator[tuple[Pid, bytes]]:
    """Every process's raw NUL-separated argv; empty for a listed process whose command
    line vanished (it may be a runner on its way out); kernel threads skipped."""
    raise NotImplementedError


@_backed
def command_line(pid: int) -> bytes | None:
    """What `iter_command_lines` yields for `pid`, read alone: its raw argv, empty for
    a listed process whose command line vanished; None where it yields nothing (gone,
    a kernel thread, a zombie, unreadable)."""
    raise NotImplementedError


@_backed
def list_processes() -> dict[Pid, Stamp | None]:
    """Every process (never a thread), each with a stamp that changes when its pid
    changes hands; None where the listing cannot tell (psutil's)."""
    raise NotImplementedError


@_backed
def processes_among(pids: Collection[int]) -> dict[Pid, Stamp | None]:
    """Those of `pids` that are processes (not threads), stamped as `list_processes`
    stamps them: a listing of a few pids."""
    raise NotImplementedError


@_backed
def stamp_of(pid: int) -> Stamp | None:
    """The stamp `list_processes` would give `pid` if it is still the process it
    listed; None: gone, or no stamp to trust. A thread's id may answer: a stamp
    another listing gave tells only that nothing took the pid over."""
    raise NotImplementedError


@_backed
def creation_mark() -> CreationMark | None:
    """Where the pid allocator stands (Linux); None where it cannot be read."""
    raise NotImplementedError


@_backed
def forked_by_main_thread(parent: int, child: int) -> bool | None:
    """Whether `child` hangs off `parent`'s main thread (PR_SET_PDEATHSIG is safe)."""
    raise NotImplementedError


# This process.


@_backed
def set_parent_death_signal(signal_number: int) -> bool:
    """Whether it was set (Linux only)."""
    raise NotImplementedError


@_backed
def become_child_subreaper() -> bool:
    """Whether this process now adopts its orphaned descendants (Linux only)."""
    raise NotImplementedError


@_backed
def thread_blocks_signal(thread: int, signal_number: int) -> bool | None:
    """Whether a thread of this process (its native id) blocks the signal now; None
    where another thread's signal mask cannot be read (only Linux shows it)."""
    raise NotImplementedError


@_backed
def close_inherited_files(lowest: int) -> None:
    """Close every fd >= `lowest`, without a close() per possible fd number where the
    OS allows (on macOS `closerange` loops over all 65,535 of exo's soft limit)."""
    raise NotImplementedError


# The machine.


@_backed
def boot_id() -> str:
    """The kernel's id of this boot, never derived from a clock where the OS has one."""
    raise NotImplementedError


@_backed
def hardware_uuid() -> str | None:
    """The Mac's hardware UUID; None elsewhere."""
    raise NotImplementedError


@_backed
def wired_memory() -> WiredMemory | str | None:
    """macOS's wired memory beside what live processes account for; a string: why the
    machine's figures cannot be read; None: not macOS."""
    raise NotImplementedError
