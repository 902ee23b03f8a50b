"""Start a stand-in worker, hard-kill it, and time how long its runners outlive it.

Shared by `exo-orphan-guard selftest`, `make demo`, the tests and the benchmarks, so
that what an operator runs on a Mac is what CI runs on Linux. Observation uses only
`system`'s process reads and, on Linux, pidfds: nothing here relies on the watch or the
sweep under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast, final

from .. import system
from ..system import settings
from ..system.identity import ProcessIdentity, identity_of, liveness
from ..system.process_facts import Pid
from .json_lines import JsonLines
from .native_calls import in_native_code_path
from .runner_kinds import RunnerKind
from .scenario_worker import SpawnFrom, Watch, WorkerReport, WorkerSpec

_START_TIMEOUT_SECONDS = 60.0
GIL_SETTLE_SECONDS = 0.3


@final
@dataclass(frozen=True, slots=True)
class StartedRunner:
    kind: RunnerKind
    identity: ProcessIdentity
    children: tuple[ProcessIdentity, ...]
    """What the runner itself started."""
    helpers: tuple[ProcessIdentity, ...]
    """What the guard started for it (its watchdog and the watchdog's understudy, if
    it stands by yet), found in the process table."""

    @property
    def watchdog(self) -> ProcessIdentity:
        """Its watchdog: the helper that is the runner's own child."""
        (watchdog,) = [
            helper for helper in self.helpers if system.parent_pid(helper.pid) == self.identity.pid
        ]
        return watchdog

    @property
    def tree(self) -> tuple[ProcessIdentity, ...]:
        return (self.identity, *self.children, *self.helpers)


@final
@dataclass(slots=True)
class StartedWorker:
    process: subprocess.Popen[str]
    runners: tuple[StartedRunner, ...]
    go_file: Path
    """In a directory of its own (`start_worker` makes it), which `cleanup` removes."""
    killed_at: float | None = None
    notes: Path | None = None
    """Where its runners write what happened to them (`notes.read_notes`)."""

    @property
    def pid(self) -> Pid:
        return Pid(self.process.pid)

    def all_processes(self) -> list[ProcessIdentity]:
        return [identity for runner in self.runners for identity in runner.tree]


def scenario_environment(
    watch: Watch, strategy: settings.Strategy = "auto", registry: Path | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    env[settings.TOGGLE_ENV] = "1" if watch in ("guard", "exo") else "0"
    env[settings.STRATEGY_ENV] = strategy
    env.pop(settings.WORKER_ENV, None)
    if registry is not None:
        env[settings.DIR_ENV] = str(registry)
    return env


def start_worker(
    runners: Sequence[RunnerKind],
    *,
    watch: Watch = "guard",
    strategy: settings.Strategy = "auto",
    spawn_from: SpawnFrom = "main",
    registry: Path | None = None,
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
    launcher: Sequence[str] = (),
    notes: Path | None = None,
) -> StartedWorker:
    """Start a worker whose runners are armed (or, for `late`, waiting) on return.

    `launcher` goes before `python` (`nohup`, say); `python` may be a bare name, found
    on the PATH of `extra_env`, as a shell would run it. `notes`: a directory where the
    runners write what happened to them (`notes.read_notes`)."""
    go_file = Path(tempfile.mkdtemp(prefix="eog-go-")) / "go"
    spec = WorkerSpec(
        runners=list(runners),
        watch=watch,
        spawn_from=spawn_from,
        go_file=str(go_file),
        notes="" if notes is None else str(notes),
    )
    env = scenario_environment(watch, strategy, registry)
    env.update(extra_env or {})
    process = subprocess.Popen(
        [*launcher, python, "-m", "exo_orphan_guard.rig.scenario_worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if os.environ.get("EOG_SCENARIO_STDERR") != "1" else None,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        report = _read_report(process)
    except BaseException:  # Ctrl-C included: runners already spawned must go too
        kill_started(process)
        raise
    started = tuple(
        StartedRunner(
            kind=kind,
            identity=_identity(entry["pid"]),
            children=tuple(_identity(child) for child in entry["children"]),
            helpers=tuple(
                _identity(pid)
                for pid in system.descendants(entry["pid"])
                if pid not in entry["children"]
            ),
        )
        for kind, entry in zip(runners, report["runners"], strict=True)
    )
    return StartedWorker(process=process, runners=started, go_file=go_file, notes=notes)


def ask_to_shut_down(worker: StartedWorker) -> None:
    """What exo's Shutdown task is to a runner: `shutdown` and `exit` runners begin theirs;
    exo-shaped runners are sent exo's `Shutdown` by their live worker."""
    Path(f"{worker.go_file}.shutdown").touch()


def finish_shutdown(worker: StartedWorker) -> None:
    """Let the `shutdown` runners' own shutdown end now rather than at its length."""
    Path(f"{worker.go_file}.finish").touch()


_NATIVE_KINDS = ("gil", "deaf", "faulty", "wedged")


def wait_in_native_code(worker: StartedWorker, timeout: float = _START_TIMEOUT_SECONDS) -> None:
    """Until each of `worker`'s runners in native code is inside its call: it made its
    mark just before, and a moment (`GIL_SETTLE_SECONDS`) takes it in."""
    marks = [
        Path(in_native_code_path(str(worker.go_file), runner.identity.pid))
        for runner in worker.runners
        if runner.kind in _NATIVE_KINDS
    ]
    if not marks:
        return
    deadline = time.monotonic() + timeout
    while not all(mark.exists() for mark in marks):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"a runner did not enter its native call within {timeout:g} s")
        time.sleep(0.01)
    time.sleep(GIL_SETTLE_SECONDS)


def kill_worker(worker: StartedWorker, *, settle: bool = True, reap_after: float = 0.0) -> float:
    """SIGKILL the worker's pid alone (never its group: runners share it) and reap it,
    at once or, like a busy parent, `reap_after` seconds later (in a thread).

    Returns the monotonic time just before the kill. `late` runners are let go after.
    With `settle`, a runner in native code (`gil`, `deaf`, `faulty`, `wedged`) is inside
    its call first (`wait_in_native_code`).
    """
    if settle:
        wait_in_native_code(worker)
    killed_at = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)
    if reap_after > 0:
        reaper = threading.Timer(reap_after, worker.process.wait)
        reaper.daemon = True
        reaper.start()
    else:
        worker.process.wait()
    worker.killed_at = killed_at
    worker.go_file.touch()
    return killed_at


def wait_gone(
    processes: Sequence[ProcessIdentity], timeout: float
) -> dict[ProcessIdentity, float | None]:
    """When each process was first seen gone (monotonic), None if alive at the timeout.

    A zombie counts as gone: it holds no memory and no queue pairs.
    """
    exits: dict[ProcessIdentity, float | None] = dict.fromkeys(processes)
    deadline = time.monotonic() + timeout
    with _ExitNotifier(processes) as notifier:
        while True:
            now = time.monotonic()
            for identity, seen in exits.items():
                if seen is None and liveness(identity) == "gone":
                    exits[identity] = now
                    notifier.forget(identity)
            if all(seen is not None for seen in exits.values()) or now >= deadline:
                return exits
            notifier.wait(min(deadline - now, 1.0))


def kill_started(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL a process this one started and everything below it, half-started or not.

    It is stopped first, so it spawns nothing between the look at its descendants and
    the kill; its descendants are then killed by identity, never by pid alone.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGSTOP)
    members = [
        identity
        for pid in system.descendants(process.pid)
        if (identity := identity_of(pid)) is not None
    ]
    if process.poll() is None:
        process.kill()
    process.wait()
    for identity in alive(members):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(identity.pid, signal.SIGKILL)
    wait_gone(members, timeout=5.0)


def alive(processes: Sequence[ProcessIdentity]) -> list[ProcessIdentity]:
    return [identity for identity in processes if liveness(identity) == "alive"]


def cleanup(worker: StartedWorker) -> None:
    """Leave nothing behind, whatever happened: kill worker, runners, their children."""
    if worker.process.poll() is None:
        worker.process.kill()
        worker.process.wait()
    with contextlib.suppress(FileNotFoundError):  # cleaned up before
        worker.go_file.touch()
    leftovers = [*worker.all_processes()]
    for identity in leftovers:
        if liveness(identity) == "alive":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(identity.pid, signal.SIGKILL)
    wait_gone(leftovers, timeout=5.0)
    # The directory and all in it (the runners' `.native-<pid>` cues too): ours alone.
    shutil.rmtree(worker.go_file.parent, ignore_errors=True)


def describe_process(identity: ProcessIdentity) -> dict[str, object]:
    """pid, ppid, RSS and age of a live process, for the demo's list of orphans."""
    try:
        details = system.process_details(identity.pid)
    except PermissionError:
        details = None
    if details is None or details.rss is None:
        return {"pid": identity.pid, "ppid": None, "rss_mib": None, "age_s": None, "state": "gone"}
    return {
        "pid": identity.pid,
        "ppid": details.ppid,
        "rss_mib": round(details.rss / 2**20, 1),
        "age_s": round(time.time() - details.create_time, 2),
        "state": details.status,
    }


def _identity(pid: int) -> ProcessIdentity:
    identity = identity_of(pid)
    # Reported moments ago by the process itself; gone already means it crashed.
    return identity if identity is not None else ProcessIdentity(Pid(pid), -1.0)


def _read_report(process: subprocess.Popen[str]) -> WorkerReport:
    assert process.stdout is not None
    report = JsonLines(process.stdout).next(_START_TIMEOUT_SECONDS)
    if report is None:
        raise RuntimeError(f"scenario worker {process.pid} did not report its runners")
    return cast(WorkerReport, report)


@final
class _ExitNotifier:
    """Sleeps until one of the processes may have exited: pidfds on Linux, 2 ms naps
    elsewhere (this measures the guard; it is not the guard)."""

    def __init__(self, processes: Sequence[ProcessIdentity]) -> None:
        self._fds: dict[ProcessIdentity, int] = {}
        self._poller = select.poll() if hasattr(os, "pidfd_open") else None
        if self._poller is None:
            return
        for identity in processes:
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(identity.pid)
                self._fds[identity] = fd
                self._poller.register(fd, select.POLLIN)

    def __enter__(self) -> _ExitNotifier:
        return self

    def __exit__(self, *_: object) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def forget(self, identity: ProcessIdentity) -> None:
        fd = self._fds.pop(identity, None)
        if fd is not None and self._poller is not None:
            self._poller.unregister(fd)
            os.close(fd)

    def wait(self, seconds: float) -> None:
        if self._poller is None or not self._fds:
            time.sleep(min(seconds, 0.002))
        else:
            self._poller.poll(max(0, int(seconds * 1000)))
