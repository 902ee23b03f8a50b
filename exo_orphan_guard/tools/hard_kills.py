"""`doctor`'s line on how runners ended since boot: the ones killed hard.

A runner whose worker died either ended the clean way (exo's own shutdown released
its model) or was killed: busy in native code past the busy wait, over its grace,
with grace 0, or by a sweep. On a Mac, exo's maintainers and MLX users report that a
process killed hard while holding wired Metal memory or RDMA resources can strand
them until a reboot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..records import endings
from ..records.endings import Ending
from .check import Check

ADVICE = (
    "on macOS a hard-killed runner's wired memory may stay stranded until a reboot: "
    "if the wired memory line (or Activity Monitor) shows it held with no model loaded, "
    "reboot; the clean ending needs EXO_ORPHAN_GUARD_GRACE > 0 (default 10 s)"
)
_LISTED = 3


def check(seen: Sequence[Ending]) -> Check:
    latest = [ending for ending in endings.latest(seen).values() if ending.event == "ended"]
    killed = endings.hard_kills(seen)
    clean = sum(ending.how == "clean" for ending in latest)
    figures = {"clean": clean, "killed": len(killed)}
    if not killed:
        return Check(
            "hard kills", "OK", f"none since boot ({clean} runner(s) ended cleanly)", None, figures
        )
    listed = "; ".join(
        f"pid {ending.pid} at {time.strftime('%H:%M:%S', time.localtime(ending.at))}: {ending.why}"
        for ending in killed[:_LISTED]
    )
    more = f" (and {len(killed) - _LISTED} more)" if len(killed) > _LISTED else ""
    return Check(
        "hard kills",
        "WARN",
        f"{len(killed)} runner(s) killed hard since boot, {clean} ended cleanly: {listed}{more}",
        ADVICE,
        figures,
    )
