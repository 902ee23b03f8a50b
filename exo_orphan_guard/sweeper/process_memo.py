"""What the guardian's scans keep of a process from one scan to the next: only what
cannot change while it runs one program, so that a settled scan reads little more
than one stat file per process it describes.

A full description (`process_table.gather`) asks for everything: details, then, for
spawn children and their parents, the files they have mapped (exo's evidence) and
their environments; each scan of an idle exo asked it all again. Kept here, per
identity (pid and start, never the pid alone) and per image (`system.process_state`:
a new one at each exec):

- the details that do not change without an exec: command line, executable, user,
  creation time;
- exo's evidence once found (a process does not unmap exo's extension, and the frozen
  app and exo's command line are its image); none found is looked for again at every
  scan: a runner maps exo's extension as it starts;
- whether it runs from exo's environment (its image's executable and prefix);
- that it is outside the guardian's own family: a process that is not its descendant
  never becomes one (an orphan goes to an ancestor of its own or to init).

What may change is read afresh at every scan, in the same pass that checks the image:
parent, state, group, memory and (on Linux) whether SIGINT is ignored; and as before
the pipes and whatever a rule reads by itself. An entry goes as soon as a scan does not describe
its process. Every ending judges afresh, with no memo, before any signal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, final

from .. import system
from ..system.process_facts import Image, Pid

if TYPE_CHECKING:
    from .process_table import ProcessInfo

Role = Literal["parent", "child"]
"""Whose evidence: a live parent's command line counts, a child's does not."""


@final
@dataclass(frozen=True, slots=True)
class _Kept:
    info: ProcessInfo
    """As described in full; what may change is replaced at each scan."""
    image: Image
    parent_evidence: str | None = None
    """exo's evidence as a live spawner, once found."""
    child_evidence: str | None = None
    environment: bool | None = None
    outside: bool = False
    """Neither the guardian nor its descendant, its ancestry read."""


@final
class ProcessMemo:
    """Kept by one guardian across its scans; each `gather` given it ends with
    `settle`, which forgets every process that scan did not describe."""

    def __init__(self) -> None:
        self._kept: dict[Pid, _Kept] = {}
        self._now: dict[Pid, _Kept] = {}
        self._ignoring: dict[Pid, bool] = {}
        """Whether SIGINT is ignored, where this scan's pass showed it."""

    def describe(
        self,
        pid: int,
        full: Callable[[int], ProcessInfo | Literal["gone", "unreadable"]],
    ) -> ProcessInfo | Literal["gone", "unreadable"]:
        """`pid` as `full` describes it, from what is kept if its identity and image
        are unchanged (what may change read afresh), else by `full`."""
        state = system.process_state(pid)
        if state is not None and state.ignores_sigint is not None:
            self._ignoring[Pid(pid)] = state.ignores_sigint
        image = None if state is None or state.start.exited else state.image
        kept = self._kept.get(Pid(pid))
        if (
            state is not None
            and image is not None
            and kept is not None
            and kept.info.started == state.start.started
            and kept.image == image
        ):
            self._now[Pid(pid)] = kept
            return dataclasses.replace(
                kept.info,
                ppid=state.ppid,
                status=state.status,
                pgid=state.pgid,
                rss=state.rss,
                memory=state.memory,
            )
        described = full(pid)
        if (
            state is not None
            and image is not None
            and not isinstance(described, str)
            and described.started == state.start.started
            and not described.exited
            and not described.vanished
        ):
            # The image was read first: an exec since then shows at the next scan.
            self._now[Pid(pid)] = _Kept(described, image)
        return described

    def evidence(self, pid: Pid, role: Role, look: Callable[[], str | None]) -> str | None:
        """exo's evidence for `pid` (described this scan) in `role`: kept once found."""
        kept = self._now.get(pid)
        if kept is not None:
            known = kept.parent_evidence if role == "parent" else kept.child_evidence
            if known is not None:
                return known
        found = look()
        if kept is not None and found is not None:
            field = "parent_evidence" if role == "parent" else "child_evidence"
            self._now[pid] = dataclasses.replace(kept, **{field: found})
        return found

    def environment(self, pid: Pid, look: Callable[[], bool]) -> bool:
        kept = self._now.get(pid)
        if kept is not None and kept.environment is not None:
            return kept.environment
        found = look()
        if kept is not None:
            self._now[pid] = dataclasses.replace(kept, environment=found)
        return found

    def ignores_sigint(self, pid: Pid) -> bool | None:
        """As this scan's pass over `pid` showed it; None: not shown there."""
        return self._ignoring.get(pid)

    def outside(self, pid: Pid) -> bool:
        """Whether `pid` was found outside the guardian's family (`found_outside`)."""
        kept = self._now.get(pid)
        return kept is not None and kept.outside

    def found_outside(self, pid: Pid) -> None:
        kept = self._now.get(pid)
        if kept is not None:
            self._now[pid] = dataclasses.replace(kept, outside=True)

    def settle(self) -> None:
        """The scan is over: what it did not describe is forgotten."""
        self._kept, self._now = self._now, {}
        self._ignoring = {}
