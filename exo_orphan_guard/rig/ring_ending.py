"""A formed MLX group whose worker dies: how its ranks end, and whether the next forms.

Both ranks of a real ring group (mlx[cpu] over loopback) hold MLX arrays and idle,
loop over MLX operations, or catch `WorkerGone`; their worker is SIGKILLed; each
rank writes down what it went through (`notes`), up to what MLX still held at its
very exit; then a new group forms on the same ports. With the guard's clean ending
the ranks exit by themselves, holding nothing; with grace 0 they are killed.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

from .. import system
from ..records import endings
from ..records.registry import host_directory
from ..system import settings
from ..system.identity import ProcessIdentity
from .notes import read_notes
from .ring_ports import free_loopback_ports, write_hostfile
from .ring_scenario import RankBehaviour, start_group, stop, wait_for_sums
from .scenarios import wait_gone

FORM_TIMEOUT_SECONDS = 20.0


@final
@dataclass(frozen=True)
class RankEnding:
    rank: int
    identity: ProcessIdentity
    gone_after: float | None
    """Seconds from the worker's SIGKILL; None: still alive at the bound."""
    notes: tuple[dict[str, Any], ...]
    ending: endings.Ending | None
    """How its watchdog (or watch) recorded the end."""

    def noted(self, event: str) -> dict[str, Any] | None:
        return next((note for note in self.notes if note["event"] == event), None)


@final
@dataclass(frozen=True)
class GroupEnding:
    ranks: tuple[RankEnding, ...]
    next_formed: bool
    formed_after: float
    """Seconds from the kill until the next group's all_sum returned (or the timeout)."""


def end_a_formed_group(
    *, then: RankBehaviour, hold_mb: int, grace: float, bound: float, scratch: Path
) -> GroupEnding:
    """Form a 2-rank group holding `hold_mb` MB per rank, SIGKILL its worker, watch the
    ranks go for up to `bound` s, then form the next group on the same ports."""
    hostfile = write_hostfile(scratch, free_loopback_ports(2))
    registry = scratch / "registry"
    notes = Path(tempfile.mkdtemp(prefix="eog-ring-notes-", dir=scratch))
    first = start_group(
        [1, 0],
        hostfile,
        guard=True,
        registry=registry,
        hold_mb=hold_mb,
        then=then,
        notes=notes,
        extra_env={settings.GRACE_ENV: f"{grace!r}"},
    )
    second = None
    try:
        if not wait_for_sums(first, 2, FORM_TIMEOUT_SECONDS):
            raise RuntimeError("the first group did not form")
        ranks = dict(first.ranks)
        killed_at = time.monotonic()
        first.process.kill()  # SIGKILL of the worker's pid alone
        first.process.wait()
        gone = {
            identity: None if seen is None else seen - killed_at
            for identity, seen in wait_gone(list(ranks.values()), bound).items()
        }
        second = start_group([1, 0], hostfile, guard=True, registry=registry)
        formed = wait_for_sums(second, 2, FORM_TIMEOUT_SECONDS)
        formed_after = time.monotonic() - killed_at
        recorded = endings.latest(
            endings.read(host_directory(registry) / endings.ENDINGS_NAME, system.boot_id())
        )
        return GroupEnding(
            ranks=tuple(
                RankEnding(
                    rank=rank,
                    identity=identity,
                    gone_after=gone[identity],
                    notes=tuple(read_notes(notes, identity.pid)),
                    ending=recorded.get(identity),
                )
                for rank, identity in sorted(ranks.items())
            ),
            next_formed=formed,
            formed_after=formed_after,
        )
    finally:
        stop(first)
        if second is not None:
            stop(second)
