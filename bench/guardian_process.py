"""The guardian as the benchmarks run it (`exo-orphan-guard service run`, its lines
stamped as they are read), and what /proc says it costs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from exo_orphan_guard.rig.scenario_worker import RunnerKind
from exo_orphan_guard.system import settings

ROOT: Final = Path(__file__).resolve().parent.parent
CONFINED: Final = ROOT / "scripts" / "confined"
READY: Final = "watching for exo processes"
WATCH_TIMEOUT_S: Final = 30.0
SERVICE_RUN: Final = (sys.executable, "-m", "exo_orphan_guard", "service", "run")
Backend = Literal["linux", "portable"]
BACKENDS: Final[tuple[Backend, ...]] = ("linux", "portable")


def guardian_environment(scratch: Path, registry: Path, backend: Backend) -> dict[str, str]:
    """The guardian's defaults, its own registry, and no exo pidfile to find."""
    env = dict(os.environ)
    for name in (
        settings.SCAN_INTERVAL_ENV,
        settings.BUSY_WAIT_ENV,
        settings.GRACE_ENV,
        settings.TOGGLE_ENV,
        settings.BACKEND_ENV,
        "EXO_HOME",
    ):
        env.pop(name, None)
    env[settings.DIR_ENV] = str(registry)
    env["XDG_CACHE_HOME"] = str(scratch / "cache")
    if backend == "portable":
        env[settings.BACKEND_ENV] = "portable"
    return env


@final
class GuardianProcess:
    """`python -m exo_orphan_guard service run` (or `command`), each stderr line stamped
    (`time.monotonic()`) as it is read."""

    def __init__(self, env: dict[str, str], command: Sequence[str] = SERVICE_RUN) -> None:
        self.process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            at = time.monotonic()
            with self._changed:
                self.lines.append((at, line.rstrip("\n")))
                self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> tuple[float, str]:
        """When the first line matching `pattern` was read, and the line."""
        found = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for at, line in self.lines:
                    if found.search(line):
                        return at, line
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    said = "\n".join(line for _, line in self.lines[-20:])
                    raise RuntimeError(f"the guardian never said {pattern!r}; it said:\n{said}")
                self._changed.wait(min(left, 0.5))

    def interrupt_wait(self) -> float:
        """The wait after SIGINT it announced at start-up: a `begun` line's deadline less
        it is when the SIGINT went."""
        _, line = self.wait_for(READY, WATCH_TIMEOUT_S)
        match = re.search(r"SIGKILL ([0-9.e+]+) s after SIGINT", line)
        if match is None:
            raise RuntimeError(f"no wait after SIGINT in {line!r}")
        return float(match.group(1))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()


def idle_runners(count: int) -> list[RunnerKind]:
    return ["idle" for _ in range(count)]


def watching(exo_pid: int) -> str:
    """The guardian's line once it watches `exo_pid`."""
    return rf"watching exo {exo_pid} \("


@dataclass(frozen=True)
class Usage:
    cpu_s: float
    wakeups: int
    threads: int


def usage(pid: int) -> Usage:
    """utime + stime of every thread (/proc/<pid>/stat) and the voluntary and
    involuntary context switches of every thread (/proc/<pid>/task/*/status)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime: fields 14 and 15
    wakeups = 0
    tasks = os.listdir(f"/proc/{pid}/task")
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        wakeups += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return Usage(cpu, wakeups, len(tasks))


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    return 0
