"""Test hook: this process's psutil sees the boot time one second later than it is.

Put on PYTHONPATH (as `sitecustomize`, run by every interpreter at start-up), it acts
only in the role named by EOG_TEST_BOOT_SHIFT: `worker` (the scenario worker) or
`runner` (its multiprocessing spawn children, and so their forked watchdogs). That is
a Mac whose `kern.boottime` moved by a second after that one process imported psutil,
or a Linux box whose clock stepped: psutil's `create_time()` moves with it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


def _role() -> str:
    if "--multiprocessing-fork" in sys.argv:
        return "runner"
    if "exo_orphan_guard.rig.scenario_worker" in getattr(sys, "orig_argv", ()):
        return "worker"
    return "other"


def _shift_boot_time(seconds: float) -> None:
    import psutil

    # psutil's per-OS module: create_time() and boot_time() both call its boot_time.
    platform_module: object = getattr(psutil, "_psplatform")  # noqa: B009
    real: Callable[[], float] = getattr(platform_module, "boot_time")  # noqa: B009

    def shifted() -> float:
        return real() + seconds

    setattr(platform_module, "boot_time", shifted)  # noqa: B010


if os.environ.get("EOG_TEST_BOOT_SHIFT") == _role():
    _shift_boot_time(1.0)
