"""SIGKILL a runner and everything it started, once its worker is confirmed dead.

Usually called from inside the runner's own process group (by the runner's watch
thread or by its watchdog), where the group kill ends the caller too. The exec
wrapper ends its command's tree with the same pieces (`verified_descendants`,
`verified_members`, `kill_verified`).

A walk of the process table is older than its answer: a pid it names may have
exited and been reused by a stranger since. So nothing is signalled by a bare pid:
each process is identified (pid and start), proven to still belong where the walk
found it (its parent, or its group, read after its identity), and checked again as
it is signalled (through a pidfd on Linux, so that the check and the signal are about
one process).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable

from .. import system
from ..system.identity import ProcessIdentity, identity_of, liveness
from .waiters import can_use_pidfd


def kill_runner_tree(
    runner: ProcessIdentity, group: int | None, known: Iterable[ProcessIdentity] = ()
) -> None:
    """`group` is the runner's own process group, or None if it could not lead one.

    The group takes the runner and everything that stayed in it with one signal, even
    after the runner is dead and they were reparented. Strays (descendants that left
    the group) are found by one walk of the tree taken before any signal, while every
    parent link still holds: a process whose parent dies is reparented and drops out
    of any later walk. A caller outside the group kills the group first and the strays
    after; a caller inside it must kill the strays first, as the group kill ends it.
    `known`: descendants proven by earlier walks, while the runner lived (a runner that
    has exited leaves nothing to walk); each is killed only if it is still the process
    identified then.
    """
    me = os.getpid()
    found = {*known, *verified_descendants(runner)}
    strays = [stray for stray in found if stray.pid != me]
    inside = group is not None and _group_of_caller() == group
    if group is not None and not inside:
        _kill_group(group)
    # Checked again as each is signalled: a pid freed by the group kill may be reused.
    kill_verified(strays)
    if group is None:
        kill_verified([runner])
    elif inside:
        _kill_group(group)


def verified_descendants(root: ProcessIdentity) -> list[ProcessIdentity]:
    """`root`'s descendants, parents first, each proven to be one: its parent, read
    after its identity, is `root` or a descendant proven before it. None of a root
    that is gone (the walk may have been of a process that took its pid)."""
    walk = system.descendants(root.pid)
    if liveness(root) != "alive":
        return []
    proven: list[ProcessIdentity] = []
    parents = {root.pid}
    for pid in walk:
        identity = identity_of(pid)
        if identity is None:
            continue
        try:
            parent = system.parent_pid(pid)
        except PermissionError:
            continue
        if parent in parents:
            parents.add(pid)
            proven.append(identity)
    return proven


def kill_strays(runner: ProcessIdentity, group: int) -> None:
    """SIGKILL what `runner` started outside its group `group`: called by the runner
    itself as it exits, the last moment a walk of its tree still finds them (once it
    has exited they are init's, and the group kill misses them). Its group (the
    watchdog among it) is left to the watchdog."""
    kill_verified(
        found
        for found in verified_descendants(runner)
        if system.process_group(found.pid) not in (group, None)
    )


class KnownTree:
    """A runner's descendants as it grows, proven by walks taken while it lives: once
    it has exited, those that left its group are init's, and no walk finds them."""

    def __init__(self, root: ProcessIdentity, every: float) -> None:
        self.root = root
        self.every = every
        self.known: set[ProcessIdentity] = set()
        self._walked: float | None = None

    def walk(self, now: float) -> None:
        """Walk again if the last walk is `every` old (or none was taken)."""
        if self._walked is not None and now - self._walked < self.every:
            return
        self._walked = now
        self.known.update(verified_descendants(self.root))


def verified_members(group: int) -> list[ProcessIdentity]:
    """The members of process group `group`, each proven one by its group, read after
    its identity."""
    proven: list[ProcessIdentity] = []
    for pid in system.group_members([group]):
        identity = identity_of(pid)
        if identity is not None and system.process_group(pid) == group:
            proven.append(identity)
    return proven


def kill_verified(targets: Iterable[ProcessIdentity]) -> None:
    """SIGKILL each target that is still the process identified; nothing else."""
    for target in targets:
        signal_verified(target, signal.SIGKILL)


def signal_verified(target: ProcessIdentity, signal_number: int) -> None:
    """Send the signal if the target is still the process identified; else nothing.
    (Without pidfds, as on macOS, a pid can still be reused between the check and the
    signal; the check makes that window microseconds instead of however long ago the
    identity was read.)"""
    if can_use_pidfd():
        _signal_through_pidfd(target, signal_number)
    elif liveness(target) == "alive":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target.pid, signal_number)


def _signal_through_pidfd(target: ProcessIdentity, signal_number: int) -> None:
    """The pidfd is opened first: if the identity still holds once it is open, the
    pidfd is that process's (a live process keeps its pid), and a signal through it
    can reach no other, whatever exits meanwhile."""
    try:
        pidfd = os.pidfd_open(target.pid)
    except OSError:
        return  # gone, or not ours to ask about
    try:
        if liveness(target) == "alive":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(pidfd, signal_number)
    finally:
        os.close(pidfd)


def _group_of_caller() -> int:
    return os.getpgrp()


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
