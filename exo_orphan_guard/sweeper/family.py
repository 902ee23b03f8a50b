"""A target's family: the target and its descendants, each proven to be its own while
it lived, which get every signal the target gets (`engine.end`), and what `scan`
lists with it (`preview`).

A walk of the process table is older than its answer: a child is taken only once its
parent, read after the child's identity, is a member still alive (so the pid was
still that member's). A target that exited never has its pid walked: whatever holds
the pid now is a stranger.
"""

from __future__ import annotations

import signal
from collections.abc import Collection, Iterable, Sequence
from typing import final

from .. import system
from ..records.freeze_journal import FreezeJournal
from ..system import signalling
from ..system.identity import ProcessIdentity, identity_of, liveness
from ..system.process_facts import Pid
from .process_table import is_guard_command


@final
class Family:
    """A target and every descendant proven so far that it may signal."""

    def __init__(self, target: ProcessIdentity) -> None:
        self.target = target
        self.members: list[ProcessIdentity] = [target]
        self.sent: list[str] = []
        self.announced = False
        uid = system.effective_uid(target.pid)
        # Read by pid: it is the target's only if the target still holds that pid.
        self.uid = uid if liveness(target) == "alive" else None

    def gone(self) -> bool:
        return all(liveness(member) == "gone" for member in self.members)

    def exiting(self) -> bool:
        """Whether what is left of it is known to be on its way out, not stuck where
        SIGKILL waits for good (`system.is_exiting`)."""
        left = [member for member in self.members if liveness(member) != "gone"]
        return all(system.is_exiting(member.pid) is True for member in left)


@final
class Freezer:
    """Stops members, each written to the journal first; none without a journal."""

    def __init__(self, journal: FreezeJournal | None) -> None:
        self._journal = journal
        self._stopped: list[ProcessIdentity] = []

    def stop(self, member: ProcessIdentity) -> None:
        if self._journal is None or member in self._stopped or not self._journal.add(member):
            return
        self._stopped.append(member)  # before the signal: whatever interrupts it, undo it
        signalling.send(member, signal.SIGSTOP)

    def release(self) -> None:
        """Continue whatever is stopped and still there, however `end` ended."""
        for member in self._stopped:
            signalling.send(member, signal.SIGCONT)


def preview(
    targets: Sequence[ProcessIdentity], protected: Collection[int]
) -> dict[Pid, tuple[Pid, ...]]:
    """What `end` would signal besides each target (its descendants), signalling
    nothing: what `scan` and `--dry-run` list."""
    families = [Family(target) for target in targets]
    prove(families, {target.pid for target in targets} | set(protected), Freezer(None))
    return {
        family.target.pid: tuple(member.pid for member in family.members[1:]) for family in families
    }


def prove(families: Iterable[Family], claimed: set[int], freezer: Freezer) -> None:
    """Stop every member (if journaled), then take each child of a live member that
    is proven its child, of the target's user and not another exo-orphan-guard
    process, until none is added."""
    families = list(families)
    while True:
        grew = False
        for family in families:
            for member in list(family.members):
                freezer.stop(member)
                for child in _proven_children(member, claimed, family.uid):
                    claimed.add(child.pid)
                    family.members.append(child)
                    grew = True
        if not grew:
            return


def _proven_children(
    member: ProcessIdentity, claimed: Collection[int], uid: int | None
) -> list[ProcessIdentity]:
    """`member`'s children now: each identified, its parent read after its identity
    and found to be `member`'s pid, `member` still alive after that (so the pid was
    still its own)."""
    if uid is None or liveness(member) != "alive":
        return []
    proven: list[ProcessIdentity] = []
    for pid in system.child_pids(member.pid):
        if pid in claimed or not _may_signal(pid, uid):
            continue
        child = identity_of(pid)
        if child is None:
            continue
        try:
            parent = system.parent_pid(pid)
        except PermissionError:
            continue
        if parent == member.pid and liveness(member) == "alive":
            proven.append(child)
    return proven


def _may_signal(pid: int, uid: int) -> bool:
    found = system.owner_and_argv(pid)
    return found is not None and found[0] == uid and not is_guard_command(found[1])
