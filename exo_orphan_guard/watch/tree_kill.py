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
from typing import Final

from .. import system
from ..system.identity import ProcessIdentity, identity_of, liveness
from .waiters import can_use_pidfd

_LATE_READS: Final = 8
"""Reads of a runner's children after its walk, at most: each finds only what was
started since the one before."""


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
    Right before the runner is killed its children are read once more: what it
    started while the walk went on. `known`: descendants proven by earlier walks, while
    the runner lived (a runner that has exited leaves nothing to walk); each is killed
    only if it is still the process identified then.
    """
    me = os.getpid()
    found = {*known, *verified_descendants(runner)}
    strays = [stray for stray in found if stray.pid != me]
    inside = group is not None and _group_of_caller() == group
    if group is not None and not inside:
        _kill_late_children(runner, found)
        _kill_group(group)
    # Checked again as each is signalled: a pid freed by the group kill may be reused.
    kill_verified(strays)
    if group is None:
        _kill_late_children(runner, found)
        kill_verified([runner])
    elif inside:
        _kill_late_children(runner, found)
        _kill_group(group)


def _kill_late_children(runner: ProcessIdentity, found: set[ProcessIdentity]) -> None:
    """SIGKILL what the runner started since the walk, right before it is killed itself.

    The walk takes its time (tens of milliseconds on a loaded machine), and a runner
    killed from its own watch thread goes on running meanwhile: its main thread can
    start a child that leaves the group, which the group kill misses and the runner's
    death hands to init. A read of its children alone is quick: read again until it
    shows none that was not dealt with, so that only that one read's moment remains.
    """
    seen = {os.getpid(), *(known.pid for known in found)}  # the caller: by the group kill
    for _ in range(_LATE_READS):
        late = [pid for pid in system.child_pids(runner.pid) if pid not in seen]
        if not late:
            return
        seen.update(late)
        kill_verified(_children_proven(runner, late))


def _children_proven(runner: ProcessIdentity, pids: Iterable[int]) -> list[ProcessIdentity]:
    """Those of `pids` proven children of `runner`: each identified, then its parent read."""
    if liveness(runner) != "alive":
        return []  # its pid's children may be another process's
    proven: list[ProcessIdentity] = []
    for pid in pids:
        identity = identity_of(pid)
        with contextlib.suppress(PermissionError):
            if identity is not None and system.parent_pid(pid) == runner.pid:
                proven.append(identity)
    return proven


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
