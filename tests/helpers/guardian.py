"""A real guardian (`service run`) in a subprocess, and what it says; and a stand-in
that only holds `guardian.lock` and writes `guardian.json`, as `service run` does, for
`service status` and `doctor` to find."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path

from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.records.user_dir import user_dir
from exo_orphan_guard.system import boot_id
from exo_orphan_guard.system.identity import ProcessIdentity

READY = "watching for exo processes"
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
        me.pid, me.started, system.boot_id(), time.time(), sys.argv[2], "0.0.test",
        leaving=sys.argv[3] == "leaving",
    )
    guardian_state.write_state(directory, state)
    print("ready", flush=True)
    threading.Event().wait(120)
"""


STOP_SECONDS = 10.0


class RunningGuardian:
    """`exo-orphan-guard service run`, its stderr collected line by line."""

    def __init__(
        self,
        env: Mapping[str, str],
        *arguments: str,
        command: Sequence[str] | None = None,
        cwd: str | None = None,
    ) -> None:
        """`command`: the whole command line, as a service file gives it (default:
        this interpreter's `-m exo_orphan_guard service run ARGUMENTS`)."""
        argv = [sys.executable, "-m", "exo_orphan_guard", "service", "run", *arguments]
        self.process = subprocess.Popen(
            argv if command is None else list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env),
            cwd=cwd,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = 30.0) -> str:
        """The first line matching `pattern`, waited for; AssertionError with what it
        said if none comes."""
        found = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if found.search(line):
                        return line
                left = deadline - time.monotonic()
                assert (left > 0 and self.process.poll() is None) or any(
                    found.search(line) for line in self.lines
                ), f"the guardian never said {pattern!r}; it said:\n" + "\n".join(self.lines)
                self._changed.wait(min(left, 0.1) if left > 0 else 0.01)

    def watching(self, exo_pid: int, timeout: float = 30.0) -> str:
        return self.wait_for(rf"watching exo {exo_pid} \(", timeout)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@contextlib.contextmanager
def guardian(registry: Path, *arguments: str, **env: str) -> Generator[RunningGuardian]:
    """A guardian over `registry`, ready when entered (its start-up sweep begun), and
    stopped (SIGTERM, else SIGKILL) on the way out."""
    environment = {**os.environ, **env}
    running = RunningGuardian(environment, *arguments)
    try:
        running.wait_for(READY)
        yield running
    finally:
        running.stop()


def guardian_home() -> Path:
    """The user's guardian directory (`user_dir`), made if missing."""
    home, problem = user_dir(create=True)
    assert home is not None, problem
    return home


def guardian_endings(registry: Path) -> list[endings.Ending]:
    path = host_directory(registry) / endings.ENDINGS_NAME
    return [ending for ending in endings.read(path, boot_id()) if ending.by == "guardian"]


def ended_line(
    registry: Path, runner: ProcessIdentity, timeout: float = 5.0
) -> endings.Ending | None:
    """The guardian's `ended` line for `runner`, waited for: it is written once the
    ending's wait is over, a moment after the runner is gone."""
    deadline = time.monotonic() + timeout
    while True:
        for ending in reversed(guardian_endings(registry)):
            if ending.identity == runner and ending.event == "ended":
                return ending
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


@contextlib.contextmanager
def stand_in_guardian(
    directory: Path, mode: str = "service", *, leaving: bool = False
) -> Generator[subprocess.Popen[str]]:
    """Running, holding the lock, once entered; SIGKILLed on the way out (its state
    file stays, as a killed guardian's does). `leaving`: its state says it is about
    to leave."""
    words = [str(directory), mode, "leaving" if leaving else "staying"]
    process = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, *words], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)
