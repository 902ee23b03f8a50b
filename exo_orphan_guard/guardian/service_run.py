"""`exo-orphan-guard service run`: the guardian in the foreground (work in progress)."""

from __future__ import annotations

from ..records.guardian_state import Mode


def run(mode: Mode = "foreground", *, leave_when_idle: bool = False) -> int:
    """Guard until stopped; the exit code. (Being written: see issue 34.)"""
    raise NotImplementedError(f"service run ({mode}, leave_when_idle={leave_when_idle})")
