"""The guardian (`exo-orphan-guard service run`): how fast it ends a killed exo's
runners (`guardian_latency`), what it costs while nothing happens (here), and how long
it takes to see a new exo (`guardian_notice`).

Idle cost: three guardians side by side, each in a pid namespace of its own
(`scripts/confined`, nested in the one `make bench` runs in) with a live stand-in
worker and 0, 1 or 8 idle runners; each namespace's driver (`idle-child` below) reads
its guardian's /proc figures and prints them as JSON.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypedDict, cast

import psutil

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.stand_in_exo import make_exo_environment
from exo_orphan_guard.system import settings

from . import guardian_latency, guardian_notice
from .document import header, machine
from .guardian_latency import LatencyResults, run_latency
from .guardian_notice import NoticeResults, run_notice
from .guardian_process import (
    CONFINED,
    READY,
    ROOT,
    WATCH_TIMEOUT_S,
    GuardianProcess,
    guardian_environment,
    idle_runners,
    status_kib,
    usage,
    watching,
)

IDLE_RUNNERS: Final = (0, 1, 8)
IDLE_SETTLE_S: Final = 5.0
"""After the guardian watches the worker: its start-up sweep over, two scans done."""


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
            guardian.wait_for(watching(worker.pid), WATCH_TIMEOUT_S)
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
            hwm_kib=status_kib(guardian.pid, "VmHWM"),
            rss_kib=status_kib(guardian.pid, "VmRSS"),
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


def section(arguments: argparse.Namespace, scratch: Path) -> str:
    rounds: int = arguments.guardian_rounds
    seconds: float = arguments.guardian_idle_seconds
    notice_rounds: int = arguments.guardian_notice_rounds
    where = machine()  # before the run: its 2,000 sleeps take a moment to be reaped
    results = run(rounds, seconds, notice_rounds, scratch)
    interval = settings.DEFAULT_SCAN_INTERVAL_SECONDS
    return "\n".join(
        [
            header(
                "The guardian (`service run`): a killed exo's runners ended from outside",
                f"python -m bench.run_all --only guardian --guardian-rounds {rounds} "
                f"--guardian-idle-seconds {seconds:g} "
                f"--guardian-notice-rounds {notice_rounds}",
                where,
            ),
            f"Defaults throughout (scan every {interval:g} s, busy wait "
            f"{settings.DEFAULT_BUSY_WAIT_SECONDS:g} s). {rounds} rounds per backend, the "
            f"backends alternating in blocks of {guardian_latency.BLOCK_ROUNDS} rounds, a fresh "
            "guardian (its own registry) per block. In each round an exo-shaped stand-in "
            "worker (a venv the sweep takes for exo's) starts one idle, unguarded runner; "
            "once the guardian says `watching exo <pid>`, the worker is SIGKILLed. Time runs "
            "from just before `kill(worker, SIGKILL)`. SIGINT sent: the guardian's own "
            "`begun` line, whose deadline is `time.monotonic()` just before the SIGINT plus "
            "the wait after SIGINT it announces at start-up (the busy wait, never less than "
            "the grace; CLOCK_MONOTONIC is one clock for every process of a boot). "
            "Gone: the runner's pidfd turning readable, seen by the benchmark. The portable "
            "backend (`EXO_ORPHAN_GUARD_BACKEND=portable`, what macOS runs without kqueue) "
            f"waits on an exo's exit by polling every {guardian_latency.PORTABLE_POLL_S:g} s, "
            "so its rows carry up to that much more. Goals: SIGINT within p99 20 ms, the "
            "idle runner gone within p99 1 s. Rounds run again because a worker did not "
            f"start or was not seen: {results.latency.restarts}.\n",
            guardian_latency.render_latency(results.latency),
            "",
            f"Idle cost: three guardians side by side for {seconds:g} s, each in a pid "
            "namespace of its own (`scripts/confined` nested in the benchmark's), so each "
            "sees only its own live stand-in worker and its 0, 1 or 8 idle runners. From "
            "5 s after it watches the worker (its start-up sweep over): CPU is utime + "
            "stime of every thread (`/proc/<pid>/stat`), wake-ups the voluntary + "
            "involuntary context switches summed over `/proc/<pid>/task/*/status`, memory "
            "the peak RSS (`VmHWM`). Per minute: the mean, and the worst whole minute.\n",
            render_idle(results.idle),
            "",
            f"Noticing a new exo: {guardian_notice.NOTICE_LOAD} unrelated `sleep`s alive, as "
            f"in the sweep section. {notice_rounds} rounds, each after a random pause of "
            f"0-{interval:g} s, start a stand-in worker with "
            f"{guardian_notice.NOTICE_RUNNERS} idle runners and time until the guardian's "
            "`watching exo <pid>` line is read. The guardian only sees an exo at its next "
            f"scan, so from its first runner's start (`/proc` start time, 10 ms ticks) this "
            f"should be about uniform in [scan, "
            f"{interval:g} s + scan]. The scan row times a full scan (`judge` with the "
            "fingerprint rule over every command line, then the watch list) in the "
            "benchmark's own process, what the guardian did before its cheap pass (the two "
            "side by side: the guardian-scan section); the last row is the guardian's own "
            "CPU time over a window with no exo, divided by the scans in it.\n",
            guardian_notice.render_notice(results.notice, notice_rounds),
            "",
        ]
    )


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
