"""A stand-in guardian: a real process that holds `guardian.lock` and writes its own
`guardian.json`, as `service run` does, for `service status` and `doctor` to find."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

_SCRIPT = """
import sys, threading, time
from pathlib import Path
from exo_orphan_guard import system
from exo_orphan_guard.records import guardian_state
from exo_orphan_guard.system.identity import current_identity

directory = Path(sys.argv[1])
with guardian_state.guardian_lock(directory) as held:
    me = current_identity()
    state = guardian_state.GuardianState(
        me.pid, me.started, system.boot_id(), time.time(), "service", "0.0.test"
    )
    guardian_state.write_state(directory, state)
    print("ready", flush=True)
    threading.Event().wait(120)
"""


@contextmanager
def stand_in_guardian(directory: Path) -> Generator[subprocess.Popen[str]]:
    """Running, holding the lock, once entered; SIGKILLed on the way out (its state
    file stays, as a killed guardian's does)."""
    process = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(directory)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)
