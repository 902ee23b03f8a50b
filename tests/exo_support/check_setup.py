"""What the checks in tests/exo_support share: the guard's environment in a scratch
directory, the report of the guard's wiring in the exo tree, and the processes they
plant. Standard library and psutil only: it is imported before anything of exo."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SLEEPER = "import time; time.sleep(600)"
SPAWN_FLAG = "--multiprocessing-fork"


def prepare_env(scratch: Path) -> None:
    """The guard's switch and registry, and the directories exo reads at import."""
    registry = scratch / "orphan-guard"
    registry.mkdir()
    os.environ["EXO_ORPHAN_GUARD"] = "1"
    os.environ["EXO_ORPHAN_GUARD_DIR"] = str(registry)
    dashboard = scratch / "dashboard"
    dashboard.mkdir()
    (dashboard / "index.html").write_text("<!doctype html><title>exo test</title>\n")
    (scratch / "resources").mkdir()
    os.environ.setdefault("EXO_RESOURCES_DIR", str(scratch / "resources"))
    os.environ.setdefault("EXO_DASHBOARD_DIR", str(dashboard))
    for name in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        os.environ.setdefault(name, str(scratch / name.lower()))


def report_guard_wiring(note: Callable[[str], None], *, unpatched: str) -> None:
    """Say through `note` whether this tree is patched (`unpatched` says what then does
    not happen) and the package importable; then prepare the worker as exo would."""
    try:
        from exo.worker import orphan_guard  # pyright: ignore[reportAttributeAccessIssue]
    except ImportError:
        note(f"exo.worker.orphan_guard missing: unpatched tree, {unpatched}")
        return
    package = getattr(orphan_guard, "_package", None)
    note(f"patched tree; exo_orphan_guard importable: {package is not None}")
    orphan_guard.prepare_worker()  # what the patched Worker.run does first


@dataclass
class Planted:
    """A process we started, known by pid and start time (so pid reuse is no match)."""

    pid: int
    create_time: float
    popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def of(cls, pid: int, popen: subprocess.Popen[bytes] | None = None) -> Planted:
        import psutil

        return cls(pid, psutil.Process(pid).create_time(), popen)

    def alive(self) -> bool:
        import psutil

        try:
            process = psutil.Process(self.pid)
            return process.create_time() == self.create_time and process.status() not in (
                psutil.STATUS_ZOMBIE,
                psutil.STATUS_DEAD,
            )
        except psutil.NoSuchProcess:
            return False

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(timeout=10)


def start_orphan() -> Planted:
    """The venv's python, flagged as a spawn child, whose parent has already exited."""
    script = f'"$0" -c "{SLEEPER}" {SPAWN_FLAG} </dev/null >/dev/null 2>&1 & echo $!'
    output = subprocess.run(
        ["sh", "-c", script, sys.executable], check=True, capture_output=True, text=True
    ).stdout
    return Planted.of(int(output.split()[0]))  # sh has exited: reparented by now


def start_own_runner() -> Planted:
    """The same kind of process, but a direct child of this (worker) process."""
    popen = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, SPAWN_FLAG],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    return Planted.of(popen.pid, popen)
