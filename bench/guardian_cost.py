"""The guardian (`exo-orphan-guard service run`): how fast it ends a killed exo's
runners, what it costs while nothing happens, and how long it takes to see a new exo.

1. Latency: one guardian at a time (its own registry), an exo-shaped stand-in worker
   with one idle, unguarded runner per round; the worker is SIGKILLed once the
   guardian watches it. SIGINT time is the guardian's own `begun` line (its deadline
   less the busy wait: `time.monotonic()` just before the SIGINT, the same clock in
   every process of one boot); gone is the runner's pidfd turning readable, seen here.
   Both backends, in alternating blocks of rounds, each block with a fresh guardian.
2. Idle cost: three guardians side by side, each in a pid namespace of its own
   (`scripts/confined`, nested in the one `make bench` runs in) with a live stand-in
   worker and 0, 1 or 8 idle runners; each namespace's driver (`idle-child` below)
   reads its guardian's /proc figures and prints them as JSON.
3. Notice: with 2,000 unrelated `sleep`s alive, from starting a stand-in worker to the
   guardian's `watching exo <pid>` line; and what one scan costs at that size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TypedDict, cast, final

import psutil

from exo_orphan_guard.guardian import watchlist
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.host_key import host_directory
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.scenario_worker import RunnerKind
from exo_orphan_guard.rig.stand_in_exo import make_exo_environment
from exo_orphan_guard.sweeper.judging import judge
from exo_orphan_guard.sweeper.verdicts import SweepOptions
from exo_orphan_guard.system import boot_id, settings
from exo_orphan_guard.system.identity import ProcessIdentity

from .stats import Samples
from .sweep_cost import UnrelatedProcesses

ROOT: Final = Path(__file__).resolve().parent.parent
CONFINED: Final = ROOT / "scripts" / "confined"
READY: Final = "watching for exo processes"
BLOCK_ROUNDS: Final = 10
"""Rounds per guardian: the backends alternate in blocks of this many."""
GONE_TIMEOUT_S: Final = 10.0
WATCH_TIMEOUT_S: Final = 30.0
IDLE_RUNNERS: Final = (0, 1, 8)
IDLE_SETTLE_S: Final = 5.0
"""After the guardian watches the worker: its start-up sweep over, two scans done."""
NOTICE_LOAD: Final = 2000
NOTICE_RUNNERS: Final = 2
SCAN_REPETITIONS: Final = 20
SCAN_CPU_WINDOW_S: Final = 20.0
PORTABLE_POLL_S: Final = 0.1
MAX_RESTARTS: Final = 10
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
    """`python -m exo_orphan_guard service run`, each stderr line stamped
    (`time.monotonic()`) as it is read."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "exo_orphan_guard", "service", "run"],
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

    def busy_bound(self) -> float:
        """The busy wait it announced at start-up (the SIGINT's deadline less it is when
        the SIGINT went)."""
        _, line = self.wait_for(READY, WATCH_TIMEOUT_S)
        match = re.search(r"busy wait ([0-9.e+]+) s", line)
        if match is None:
            raise RuntimeError(f"no busy wait in {line!r}")
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


def _watching(exo_pid: int) -> str:
    return rf"watching exo {exo_pid} \("


# 1. Latency ----------------------------------------------------------------------


@dataclass
class LatencyResults:
    to_sigint: dict[Backend, Samples] = field(
        default_factory=lambda: {backend: Samples() for backend in BACKENDS}
    )
    to_gone: dict[Backend, Samples] = field(
        default_factory=lambda: {backend: Samples() for backend in BACKENDS}
    )
    restarts: int = 0


def run_latency(rounds: int, scratch: Path, exo_python: str) -> LatencyResults:
    results = LatencyResults()
    blocks = [min(BLOCK_ROUNDS, rounds - start) for start in range(0, rounds, BLOCK_ROUNDS)]
    for number, block in enumerate(blocks):
        order = list(BACKENDS)
        random.shuffle(order)
        for backend in order:
            registry = scratch / f"latency-{backend}-{number}"
            guardian = GuardianProcess(guardian_environment(scratch, registry, backend))
            try:
                bound = guardian.busy_bound()
                done = 0
                while done < block:
                    try:
                        _latency_round(guardian, bound, registry, exo_python, backend, results)
                    except RuntimeError as error:
                        results.restarts += 1
                        print(f"  guardian latency: round again ({error})", flush=True)
                        if results.restarts > MAX_RESTARTS:
                            raise
                        continue
                    done += 1
            finally:
                guardian.stop()
        print(f"  guardian latency: block {number + 1} of {len(blocks)} done", flush=True)
    return results


def _latency_round(
    guardian: GuardianProcess,
    bound: float,
    registry: Path,
    exo_python: str,
    backend: Backend,
    results: LatencyResults,
) -> None:
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python, registry=registry)
    try:
        guardian.wait_for(_watching(worker.pid), WATCH_TIMEOUT_S)
        time.sleep(random.uniform(0.05, 0.25))  # off the guardian's scan beat
        runner = worker.runners[0].identity
        killed_at = scenarios.kill_worker(worker)
        gone_at = scenarios.wait_gone([runner], GONE_TIMEOUT_S)[runner]
        begun = _guardian_line(registry, runner, "begun", GONE_TIMEOUT_S)
    finally:
        scenarios.cleanup(worker)
    if begun is None or begun.deadline is None:
        results.to_sigint[backend].add(None)
    else:
        results.to_sigint[backend].add((begun.deadline - bound - killed_at) * 1000)
    results.to_gone[backend].add(None if gone_at is None else (gone_at - killed_at) * 1000)


def _guardian_line(
    registry: Path, runner: ProcessIdentity, event: endings.Event, timeout: float
) -> endings.Ending | None:
    path = host_directory(registry) / endings.ENDINGS_NAME
    deadline = time.monotonic() + timeout
    boot = boot_id()
    while True:
        for ending in endings.read(path, boot):
            if ending.by == "guardian" and ending.identity == runner and ending.event == event:
                return ending
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def render_latency(results: LatencyResults) -> str:
    lines = [
        "| backend | from the worker's SIGKILL to | trials | done | p50 ms | p99 ms | max ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    names: dict[Backend, str] = {
        "linux": "linux (pidfd)",
        "portable": f"portable (polls every {PORTABLE_POLL_S:g} s)",
    }
    for backend in BACKENDS:
        for what, samples in (
            ("SIGINT sent (guardian's `begun`)", results.to_sigint[backend]),
            ("idle runner gone", results.to_gone[backend]),
        ):
            lines.append(
                f"| {names[backend]} | {what} | {samples.count} | {samples.exited} | "
                f"{samples.quantile_text(0.5, GONE_TIMEOUT_S)} | "
                f"{samples.quantile_text(0.99, GONE_TIMEOUT_S)} | "
                f"{samples.quantile_text(1.0, GONE_TIMEOUT_S)} |"
            )
    return "\n".join(lines)


# 2. Idle cost --------------------------------------------------------------------


class IdleFigures(TypedDict):
    runners: int
    seconds: float
    cpu_s: float
    wakeups: int
    threads: int
    hwm_kib: int
    rss_kib: int
    minutes_cpu_s: list[float]
    minutes_wakeups: list[int]
    processes: int


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


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    return 0


def idle_child(runners: int, seconds: float, scratch: Path, exo_python: str) -> IdleFigures:
    """In a pid namespace of its own: a live stand-in worker with `runners` idle
    runners, a guardian, and the guardian's figures over `seconds`."""
    registry = scratch / "registry"
    worker = scenarios.start_worker(
        idle_runners(runners), watch="none", python=exo_python, registry=registry
    )
    guardian = GuardianProcess(guardian_environment(scratch, registry, "linux"))
    try:
        guardian.wait_for(READY, WATCH_TIMEOUT_S)
        if runners:
            guardian.wait_for(_watching(worker.pid), WATCH_TIMEOUT_S)
        time.sleep(IDLE_SETTLE_S)
        start = usage(guardian.pid)
        began = time.monotonic()
        minutes_cpu: list[float] = []
        minutes_wakeups: list[int] = []
        previous = start
        while (left := began + seconds - time.monotonic()) > 0:
            time.sleep(min(60.0, left))
            now = usage(guardian.pid)
            if min(60.0, left) >= 60.0:
                minutes_cpu.append(now.cpu_s - previous.cpu_s)
                minutes_wakeups.append(now.wakeups - previous.wakeups)
            previous = now
        end = previous
        if guardian.process.poll() is not None:
            raise RuntimeError("the guardian exited during the idle run")
        return IdleFigures(
            runners=runners,
            seconds=time.monotonic() - began,
            cpu_s=end.cpu_s - start.cpu_s,
            wakeups=end.wakeups - start.wakeups,
            threads=end.threads,
            hwm_kib=_status_kib(guardian.pid, "VmHWM"),
            rss_kib=_status_kib(guardian.pid, "VmRSS"),
            minutes_cpu_s=minutes_cpu,
            minutes_wakeups=minutes_wakeups,
            processes=len(psutil.pids()),
        )
    finally:
        guardian.stop()
        scenarios.cleanup(worker)


def run_idle(seconds: float, scratch: Path, exo_python: str) -> list[IdleFigures]:
    """The three namespaces side by side."""
    children: list[subprocess.Popen[str]] = []
    for runners in IDLE_RUNNERS:
        directory = scratch / f"idle-{runners}"
        directory.mkdir()
        command = [
            str(CONFINED),
            sys.executable,
            "-m",
            "bench.guardian_cost",
            "idle-child",
            "--runners",
            str(runners),
            "--seconds",
            str(seconds),
            "--scratch",
            str(directory),
            "--exo-python",
            exo_python,
        ]
        children.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True))
    figures: list[IdleFigures] = []
    for child in children:
        output, _ = child.communicate(timeout=seconds + 300)
        if child.returncode != 0:
            raise RuntimeError(f"idle-child exited {child.returncode}: {output[-2000:]}")
        figures.append(cast(IdleFigures, json.loads(output.strip().splitlines()[-1])))
    return figures


def render_idle(figures: list[IdleFigures]) -> str:
    seconds = min(figure["seconds"] for figure in figures)
    lines = [
        f"| idle runners watched | CPU ms in {seconds:.0f} s | CPU ms per minute (max) "
        f"| wake-ups in {seconds:.0f} s | wake-ups per minute (max) | threads "
        "| max RSS MiB (VmHWM) | processes in its namespace |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for figure in figures:
        minutes = figure["seconds"] / 60
        cpu_max = max(figure["minutes_cpu_s"], default=figure["cpu_s"])
        wake_max = max(figure["minutes_wakeups"], default=figure["wakeups"])
        lines.append(
            f"| {figure['runners']} | {figure['cpu_s'] * 1000:.0f} "
            f"| {figure['cpu_s'] * 1000 / minutes:.0f} ({cpu_max * 1000:.0f}) "
            f"| {figure['wakeups']} | {figure['wakeups'] / minutes:.0f} ({wake_max}) "
            f"| {figure['threads']} | {figure['hwm_kib'] / 1024:.1f} | {figure['processes']} |"
        )
    return "\n".join(lines)


# 3. Notice -------------------------------------------------------------------------


@dataclass
class NoticeResults:
    from_start: Samples = field(default_factory=Samples)
    from_up: Samples = field(default_factory=Samples)
    scan: Samples = field(default_factory=Samples)
    guardian_cpu_per_scan_ms: float = 0.0
    total_processes: int = 0


def run_notice(rounds: int, scratch: Path, exo_python: str) -> NoticeResults:
    results = NoticeResults()
    registry = scratch / "notice"
    env = guardian_environment(scratch, registry, "linux")
    with UnrelatedProcesses(NOTICE_LOAD):
        results.total_processes = len(psutil.pids())
        guardian = GuardianProcess(env)
        try:
            guardian.wait_for(READY, WATCH_TIMEOUT_S)
            time.sleep(2 * settings.DEFAULT_SCAN_INTERVAL_SECONDS)  # the start-up sweep
            before = usage(guardian.pid)
            time.sleep(SCAN_CPU_WINDOW_S)
            after = usage(guardian.pid)
            scans = SCAN_CPU_WINDOW_S / settings.DEFAULT_SCAN_INTERVAL_SECONDS
            results.guardian_cpu_per_scan_ms = (after.cpu_s - before.cpu_s) * 1000 / scans
            for _ in range(SCAN_REPETITIONS):
                started = time.perf_counter()
                _one_scan(registry)
                results.scan.add((time.perf_counter() - started) * 1000)
            for number in range(rounds):
                time.sleep(random.uniform(0.0, settings.DEFAULT_SCAN_INTERVAL_SECONDS))
                started_at = time.monotonic()
                worker = scenarios.start_worker(
                    idle_runners(NOTICE_RUNNERS), watch="none", python=exo_python, registry=registry
                )
                try:
                    seen_at, _ = guardian.wait_for(_watching(worker.pid), WATCH_TIMEOUT_S)
                    first_runner = min(
                        _started_monotonic(runner.identity.pid) for runner in worker.runners
                    )
                finally:
                    scenarios.cleanup(worker)
                results.from_start.add((seen_at - started_at) * 1000)
                results.from_up.add((seen_at - first_runner) * 1000)
                if (number + 1) % 5 == 0:
                    print(f"  guardian notice: {number + 1} of {rounds} rounds", flush=True)
        finally:
            guardian.stop()
    return results


def _started_monotonic(pid: int) -> float:
    """When `pid` started, on this process's monotonic clock: its start time in
    /proc/<pid>/stat counts clock ticks (10 ms) of CLOCK_BOOTTIME."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    return started - time.clock_gettime(time.CLOCK_BOOTTIME) + time.monotonic()


def _one_scan(registry: Path) -> None:
    """What the guardian's scan does: judge the process table as a sweep does, and pick
    the exo processes to watch from it."""
    opened, _ = Registry.open(registry, create=False)
    table, verdicts = judge(opened, SweepOptions(fingerprint=True), [])
    watchlist.exo_processes(table, verdicts)


def render_notice(results: NoticeResults, rounds: int) -> str:
    rows = [
        ("start of the stand-in worker → `watching exo <pid>`", rounds, results.from_start),
        ("its first runner's start → `watching exo <pid>`", rounds, results.from_up),
        ("one scan (`judge` + the watch list), in process", SCAN_REPETITIONS, results.scan),
    ]
    lines = [
        f"| at {NOTICE_LOAD} unrelated processes ({results.total_processes} alive) "
        "| trials | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, count, samples in rows:
        lines.append(
            f"| {name} | {count} | {samples.quantile_text(0.5, WATCH_TIMEOUT_S)} | "
            f"{samples.quantile_text(0.99, WATCH_TIMEOUT_S)} | "
            f"{samples.quantile_text(1.0, WATCH_TIMEOUT_S)} |"
        )
    lines.append(
        f"| the guardian's own CPU per scan (over {SCAN_CPU_WINDOW_S:g} s, no exo) | "
        f"{SCAN_CPU_WINDOW_S / settings.DEFAULT_SCAN_INTERVAL_SECONDS:.0f} | "
        f"{results.guardian_cpu_per_scan_ms:.1f} (mean) | - | - |"
    )
    return "\n".join(lines)


# All three -------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardianResults:
    latency: LatencyResults
    idle: list[IdleFigures]
    notice: NoticeResults


def run(rounds: int, idle_seconds: float, notice_rounds: int, scratch: Path) -> GuardianResults:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started in the background by a shell: the stand-ins would inherit SIGINT
        # ignored, and sit out the guardian's SIGINT until the busy wait.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    exo_python = make_exo_environment(scratch / "exo-venv")
    latency = run_latency(rounds, scratch, exo_python)
    print("  guardian: latency done; notice next", flush=True)
    notice = run_notice(notice_rounds, scratch, exo_python)
    print("  guardian: notice done; idle cost next", flush=True)
    idle = run_idle(idle_seconds, scratch, exo_python)
    return GuardianResults(latency, idle, notice)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.guardian_cost")
    commands = parser.add_subparsers(dest="command", required=True)
    child = commands.add_parser("idle-child", help="one idle guardian, in its own namespace")
    child.add_argument("--runners", type=int, required=True)
    child.add_argument("--seconds", type=float, required=True)
    child.add_argument("--scratch", type=Path, required=True)
    child.add_argument("--exo-python", required=True)
    arguments = parser.parse_args()
    runners: int = arguments.runners
    seconds: float = arguments.seconds
    scratch: Path = arguments.scratch
    exo_python: str = arguments.exo_python
    print(json.dumps(idle_child(runners, seconds, scratch, exo_python)), flush=True)


if __name__ == "__main__":
    main()
