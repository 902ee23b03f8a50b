"""What a sweep did: its verdicts, what came of each kill, and a one-line summary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

from ..records import endings
from ..system.identity import ProcessIdentity
from ..system.process_facts import Pid
from .engine import KillResult
from .verdicts import Verdict


@final
@dataclass(frozen=True, slots=True)
class SweepReport:
    verdicts: tuple[Verdict, ...]
    results: tuple[KillResult, ...]
    warnings: tuple[str, ...]
    dry_run: bool
    registry: Path | None
    elapsed_seconds: float
    lock_acquired: bool = True
    would_signal: Mapping[Pid, tuple[Pid, ...]] = field(default_factory=dict[Pid, tuple[Pid, ...]])
    """Dry runs: each target's descendants, which a sweep would signal with it."""
    other_users_spared: int = 0
    continued: tuple[ProcessIdentity, ...] = ()
    """Processes a dead sweeper had left stopped, continued by this sweep."""
    target_endings: Mapping[ProcessIdentity, endings.Ending] = field(
        default_factory=dict[ProcessIdentity, endings.Ending]
    )
    """Dry runs: what the targets' watchdogs recorded (an ending under way, say)."""
    left_to_end: tuple[ProcessIdentity, ...] = ()
    """Runners ending by themselves that the sweep stopped waiting for (`stop`): never
    signalled, left to their watchdogs, their records kept."""

    def merged(self, other: SweepReport) -> SweepReport:
        """This sweep and `other`, one after the other (of another registry): what
        both found and did; the registry named is this one's."""
        return SweepReport(
            verdicts=self.verdicts + other.verdicts,
            results=self.results + other.results,
            warnings=self.warnings + other.warnings,
            dry_run=self.dry_run,
            registry=self.registry,
            elapsed_seconds=self.elapsed_seconds + other.elapsed_seconds,
            lock_acquired=self.lock_acquired and other.lock_acquired,
            would_signal={**self.would_signal, **other.would_signal},
            other_users_spared=self.other_users_spared + other.other_users_spared,
            continued=self.continued + other.continued,
            target_endings={**self.target_endings, **other.target_endings},
            left_to_end=self.left_to_end + other.left_to_end,
        )

    @property
    def targets(self) -> tuple[Verdict, ...]:
        return tuple(verdict for verdict in self.verdicts if verdict.action == "kill")

    @property
    def survivors(self) -> tuple[KillResult, ...]:
        return tuple(result for result in self.results if result.outcome == "unkillable")

    @property
    def exit_code(self) -> int:
        """0 nothing left; 1 orphans remain (or would, for a dry run)."""
        if self.dry_run:
            return 1 if self.targets else 0
        return 1 if self.survivors or self.left_to_end or not self.lock_acquired else 0

    def summary(self) -> str:
        if not self.lock_acquired:
            return "another sweep held the registry lock: nothing done"
        if self.dry_run:
            text = f"{len(self.targets)} orphan(s) found, nothing killed (dry run)"
        else:
            killed = sum(result.outcome != "unkillable" for result in self.results)
            text = (
                f"{len(self.targets)} orphan(s) found, {killed} gone, "
                f"{len(self.survivors)} unkillable"
            )
        if self.left_to_end:
            text += (
                f"; stopped waiting for {len(self.left_to_end)} runner(s) ending by "
                "themselves, left to their watchdogs"
            )
        if self.other_users_spared:
            text += (
                f"; {self.other_users_spared} matching process(es) of other users spared "
                "(never touched unless --all-users)"
            )
        return text
