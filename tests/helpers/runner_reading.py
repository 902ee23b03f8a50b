"""A runner read from outside it, for checking that the guard changes nothing in a
live worker's runners (issue 35 item 2; `tests/test_exo_unchanged.py`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil


def observe_runner(pid: int, exo_pid: int) -> dict[str, Any]:
    """A runner as read from outside it (Linux): its signal dispositions and the main
    thread's blocked mask (`/proc/<pid>/status`), whether it shares exo's process
    group and session, the names of its descendants, and its thread count (a guarded
    runner has one thread more: the in-tree module's watch thread)."""
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":" in line
    )
    process = psutil.Process(pid)
    return {
        "SigCgt": fields["SigCgt"].strip(),
        "SigIgn": fields["SigIgn"].strip(),
        "SigBlk": fields["SigBlk"].strip(),
        "pgid_is_exos": os.getpgid(pid) == os.getpgid(exo_pid),
        "sid_is_exos": os.getsid(pid) == os.getsid(exo_pid),
        "children": sorted(child.name() for child in process.children(recursive=True)),
        "threads": int(fields["Threads"]),
    }


UNCHANGED_KEYS = ("SigCgt", "SigIgn", "SigBlk", "pgid_is_exos", "sid_is_exos", "children")
"""What must be the same guarded as unguarded (the thread count may differ by one)."""


def unchanged(observed: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """The keys of UNCHANGED_KEYS where `observed` differs from `baseline`."""
    return [key for key in UNCHANGED_KEYS if observed[key] != baseline[key]]
