"""Who a process is: its pid plus when it started, so a reused pid never passes for it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal, final

from .. import system
from .process_facts import Pid

Liveness = Literal["alive", "gone", "unknown"]


@final
@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    pid: Pid
    started: float
    """Start stamp from `system.read_start`: equal for the process's whole life."""

    def encode(self) -> str:
        return f"{self.pid}:{self.started!r}"

    @staticmethod
    def decode(text: str) -> ProcessIdentity:
        """Inverse of `encode`; ValueError on anything else."""
        pid_text, separator, started_text = text.strip().partition(":")
        if not separator:
            raise ValueError(f"expected 'pid:start', got {text!r}")
        pid = int(pid_text)
        started = float(started_text)
        if pid <= 0 or not math.isfinite(started) or started < 0:
            raise ValueError(f"expected 'pid:start', got {text!r}")
        return ProcessIdentity(Pid(pid), started)


def identity_of(pid: int) -> ProcessIdentity | None:
    """The live process now holding `pid`; None if there is none (zombies included) or
    it cannot be read, so nothing is ever done to a process that was not identified."""
    try:
        start = system.read_start(pid)
    except PermissionError:
        return None
    if start is None or start.exited:
        return None
    return ProcessIdentity(Pid(pid), start.started)


_own: list[ProcessIdentity] = []
"""This process's identity once read: it cannot change while the process runs, and a
forked child, which is another process, starts without it."""
os.register_at_fork(after_in_child=_own.clear)


def current_identity() -> ProcessIdentity:
    if not _own:
        own = identity_of(os.getpid())
        if own is None:  # pragma: no cover - our own /proc entry cannot vanish
            raise RuntimeError("cannot read this process's own start time")
        _own.append(own)
    return _own[0]


def liveness(identity: ProcessIdentity) -> Liveness:
    """Gone means exited (a zombie counts) or the pid now belongs to someone else.

    "unknown" (the process exists but cannot be read) must never be treated as gone:
    the watch would kill a healthy runner and the sweep a stranger.
    """
    try:
        start = system.read_start(identity.pid)
    except PermissionError:
        return "unknown"
    if start is None or start.exited or start.started != identity.started:
        return "gone"
    return "alive"
