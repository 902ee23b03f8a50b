"""The guardian's scan, today's against the cheap one (issue 40, item 7), side by side
in one run: what one scan costs at 2,000 unrelated processes (in this process), what
the guardian spends per minute while no exo changes, and how soon it sees a new exo.

Today's scan reads every process's command line at every scan (`EveryCommandLine`,
what `judging.judge` does without candidates); the cheap one is the guardian's own
(`guardian.cheap_scan`), also as it was before it kept what cannot change of what it
describes (`scan_variants`). Each guardian runs in a pid namespace of its own
(`scripts/confined`, nested in the one `make bench` runs in) with its own 2,000
`sleep`s, and a driver (`idle-child`, `notice-child` below) that prints its figures
as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, TypedDict, cast, final

import psutil

from exo_orphan_guard.guardian.known_processes import FULL_LISTING_SCANS
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.stand_in_exo import make_exo_environment
from exo_orphan_guard.system import settings

from .document import header, machine
from .guardian_notice import started_monotonic
from .guardian_process import (
    CONFINED,
    READY,
    ROOT,
    WATCH_TIMEOUT_S,
    GuardianProcess,
    guardian_environment,
    idle_runners,
    usage,
    watching,
)
from .one_scan import LOAD, ScanRow, render_scans, run_scans
from .scan_variants import NAMES, VARIANTS, Variant, guardian_command
from .stats import Samples
from .sweep_cost import UnrelatedProcesses

TARGET_MS_PER_MINUTE: Final = 60
TARGET_NOTICE_P99_MS: Final = 2500
Scene = Literal["quiet", "churn", "exo"]
SCENES: Final[dict[Scene, str]] = {
    "quiet": "no exo, nothing started",
    "churn": "no exo, a short-lived process started every second",
    "exo": "an idle exo (2 runners) watched, nothing started",
}
EXO_RUNNERS: Final = 2
SETTLE_S: Final = 10.0
"""After the guardian is ready: its start-up sweep over, and the cheap scan settled."""
MINUTE_S: Final = 60.0


# The guardian's CPU per minute, in namespaces of their own --------------------------


class IdleFigures(TypedDict):
    variant: Variant
    scene: Scene
    seconds: float
    cpu_s: float
    wakeups: int
    minutes_cpu_s: list[float]
    minutes_wakeups: list[int]
    processes: int


@contextmanager
def _scene(scene: Scene, registry: Path, exo_python: str) -> Generator[int | None]:
    """What else lives in the namespace: the exo worker's pid, if any."""
    if scene == "exo":
        runners = idle_runners(EXO_RUNNERS)
        worker = scenarios.start_worker(runners, watch="none", python=exo_python, registry=registry)
        try:
            yield worker.pid
        finally:
            scenarios.cleanup(worker)
    elif scene == "churn":
        stop = threading.Event()
        threading.Thread(target=_churn, args=(stop,), daemon=True).start()
        try:
            yield None
        finally:
            stop.set()
    else:
        yield None


def _churn(stop: threading.Event) -> None:
    while not stop.wait(1.0):
        subprocess.run(["true"], check=False)


def idle_child(
    variant: Variant, scene: Scene, seconds: float, scratch: Path, exo_python: str
) -> IdleFigures:
    registry = scratch / "registry"
    env = guardian_environment(scratch, registry, "linux")
    with UnrelatedProcesses(LOAD), _scene(scene, registry, exo_python) as exo:
        guardian = GuardianProcess(env, guardian_command(variant))
        try:
            guardian.wait_for(READY, WATCH_TIMEOUT_S)
            if exo is not None:
                guardian.wait_for(watching(exo), WATCH_TIMEOUT_S)
            time.sleep(SETTLE_S)
            start = usage(guardian.pid)
            began = time.monotonic()
            minutes_cpu: list[float] = []
            minutes_wakeups: list[int] = []
            previous = start
            while (left := began + seconds - time.monotonic()) > 0:
                time.sleep(min(MINUTE_S, left))
                now = usage(guardian.pid)
                if left >= MINUTE_S:
                    minutes_cpu.append(now.cpu_s - previous.cpu_s)
                    minutes_wakeups.append(now.wakeups - previous.wakeups)
                previous = now
            if guardian.process.poll() is not None:
                raise RuntimeError("the guardian exited during the idle run")
            return IdleFigures(
                variant=variant,
                scene=scene,
                seconds=time.monotonic() - began,
                cpu_s=previous.cpu_s - start.cpu_s,
                wakeups=previous.wakeups - start.wakeups,
                minutes_cpu_s=minutes_cpu,
                minutes_wakeups=minutes_wakeups,
                processes=len(psutil.pids()),
            )
        finally:
            guardian.stop()


def render_idle(figures: list[IdleFigures]) -> str:
    lines = [
        "| in its namespace, besides 2,000 `sleep`s | scan | CPU ms per minute: mean "
        "| p50 | max | wake-ups per minute: mean | processes |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    order = list(SCENES)
    for figure in sorted(
        figures, key=lambda f: (order.index(f["scene"]), VARIANTS.index(f["variant"]))
    ):
        minutes = figure["seconds"] / MINUTE_S
        per_minute = Samples([value * 1000 for value in figure["minutes_cpu_s"]])
        lines.append(
            f"| {SCENES[figure['scene']]} | {NAMES[figure['variant']]} "
            f"| {figure['cpu_s'] * 1000 / minutes:.0f} | {per_minute.quantile_text(0.5, 0)} "
            f"| {per_minute.quantile_text(1.0, 0)} | {figure['wakeups'] / minutes:.0f} "
            f"| {figure['processes']} |"
        )
    return "\n".join(lines)


# Noticing a new exo ----------------------------------------------------------------


class NoticeFigures(TypedDict):
    variant: Variant
    from_runner_ms: list[float]
    processes: int


def notice_child(variant: Variant, rounds: int, scratch: Path, exo_python: str) -> NoticeFigures:
    """From a new exo's first runner's start to the guardian's `watching exo` line."""
    registry = scratch / "registry"
    env = guardian_environment(scratch, registry, "linux")
    interval = settings.DEFAULT_SCAN_INTERVAL_SECONDS
    seen: list[float] = []
    with UnrelatedProcesses(LOAD):
        guardian = GuardianProcess(env, guardian_command(variant))
        try:
            guardian.wait_for(READY, WATCH_TIMEOUT_S)
            time.sleep(SETTLE_S)
            processes = len(psutil.pids())
            for _ in range(rounds):
                time.sleep(random.uniform(0.0, interval))
                worker = scenarios.start_worker(
                    idle_runners(EXO_RUNNERS), watch="none", python=exo_python, registry=registry
                )
                try:
                    at, _ = guardian.wait_for(watching(worker.pid), WATCH_TIMEOUT_S)
                    first = min(started_monotonic(runner.identity.pid) for runner in worker.runners)
                    seen.append((at - first) * 1000)
                finally:
                    scenarios.cleanup(worker)
        finally:
            guardian.stop()
    return NoticeFigures(variant=variant, from_runner_ms=seen, processes=processes)


def render_notice(figures: list[NoticeFigures]) -> str:
    lines = [
        "| first runner's start → `watching exo <pid>` | rounds | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for figure in sorted(figures, key=lambda f: VARIANTS.index(f["variant"])):
        samples = Samples(list[float | None](figure["from_runner_ms"]))
        lines.append(
            f"| {NAMES[figure['variant']]} | {samples.count} "
            f"| {samples.quantile_text(0.5, WATCH_TIMEOUT_S)} "
            f"| {samples.quantile_text(0.99, WATCH_TIMEOUT_S)} "
            f"| {samples.quantile_text(1.0, WATCH_TIMEOUT_S)} |"
        )
    return "\n".join(lines)


# Side by side ----------------------------------------------------------------------


@final
class Children:
    """Drivers in nested pid namespaces, run side by side; each prints one JSON line."""

    def __init__(self) -> None:
        self._started: list[subprocess.Popen[str]] = []

    def start(self, arguments: list[str]) -> None:
        command = [str(CONFINED), sys.executable, "-m", "bench.guardian_scan", *arguments]
        self._started.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True))

    def results(self, timeout: float) -> list[object]:
        found: list[object] = []
        for child in self._started:
            output, _ = child.communicate(timeout=timeout)
            if child.returncode != 0:
                raise RuntimeError(f"a driver exited {child.returncode}: {output[-2000:]}")
            found.append(json.loads(output.strip().splitlines()[-1]))
        return found


@dataclass(frozen=True)
class ScanResults:
    scans: list[ScanRow]
    total: int
    idle: list[IdleFigures]
    notice: list[NoticeFigures]


def run(seconds: float, rounds: int, repetitions: int, scratch: Path) -> ScanResults:
    exo_python = make_exo_environment(scratch / "exo-venv")
    scans, total = run_scans(repetitions)
    print("  guardian scan: one scan done; the guardians' minutes next", flush=True)
    idle = Children()
    for scene in SCENES:
        for variant in VARIANTS:
            directory = scratch / f"idle-{scene}-{variant}"
            directory.mkdir()
            idle.start(
                [
                    "idle-child",
                    f"--variant={variant}",
                    f"--scene={scene}",
                    f"--seconds={seconds}",
                    f"--scratch={directory}",
                    f"--exo-python={exo_python}",
                ]
            )
    idle_figures = cast(list[IdleFigures], idle.results(seconds + 600))
    print("  guardian scan: minutes done; noticing next", flush=True)
    notice = Children()
    for variant in VARIANTS:
        directory = scratch / f"notice-{variant}"
        directory.mkdir()
        notice.start(
            [
                "notice-child",
                f"--variant={variant}",
                f"--rounds={rounds}",
                f"--scratch={directory}",
                f"--exo-python={exo_python}",
            ]
        )
    notice_figures = cast(list[NoticeFigures], notice.results(rounds * 60 + 600))
    return ScanResults(scans, total, idle_figures, notice_figures)


def section(arguments: argparse.Namespace, scratch: Path) -> str:
    seconds: float = arguments.scan_seconds
    rounds: int = arguments.scan_notice_rounds
    repetitions: int = arguments.scan_repetitions
    where = machine()
    results = run(seconds, rounds, repetitions, scratch)
    interval = settings.DEFAULT_SCAN_INTERVAL_SECONDS
    return "\n".join(
        [
            header(
                "The guardian's scan: every command line against what is new",
                f"python -m bench.run_all --only guardian-scan --scan-seconds {seconds:g} "
                f"--scan-notice-rounds {rounds} --scan-repetitions {repetitions}",
                where,
            ),
            f"Today's scan reads every process's command line at every scan (`judge` "
            "without candidates); the cheap one (`guardian.cheap_scan`) reads only what is "
            "new, lists processes only when the pid allocator moved, and re-reads the rest "
            "in turns; and now keeps, per identity and image, what cannot change of the "
            "processes it describes (`sweeper.process_memo`): before that, it read all of "
            "it at each scan. Each then judges as a sweep does, but the guardian's own keeps "
            "the last judgement while nothing can have changed it (`guardian.judgement`), as "
            "it did not on 2026-12-07. Targets (issue 40, item 7): at "
            f"{LOAD:,} unrelated processes, at most {TARGET_MS_PER_MINUTE} ms of CPU per "
            f"minute while no exo changes, and a new exo seen within "
            f"{TARGET_NOTICE_P99_MS / 1000:g} s (p99) at the default interval "
            f"({interval:g} s).\n",
            f"One scan and the watch list, in the benchmark's own process, CPU time "
            f"(`time.process_time`), at {LOAD:,} `sleep`s: today's {repetitions // 5} times, "
            f"the cheap one {repetitions} times settled (its whole listing comes every "
            f"{FULL_LISTING_SCANS}th scan, so its p99 is that scan), then "
            f"{repetitions} times with a `true` started before each (a few pids to look "
            "at), and 5 first scans:\n",
            render_scans(results.scans, results.total),
            "",
            f"The guardian (`service run`) over {seconds:g} s, "
            f"{len(SCENES) * len(VARIANTS)} side by side, each in a "
            f"pid namespace of its own with {LOAD:,} `sleep`s, from {SETTLE_S:g} s after it is "
            "ready (its start-up sweep over, the cheap scan settled). CPU: utime + stime of "
            "every thread (`/proc/<pid>/stat`, 10 ms ticks), per whole minute; wake-ups: "
            "voluntary + involuntary context switches of its threads. The idle exo is a "
            f"stand-in worker with {EXO_RUNNERS} idle runners: each scan describes them and "
            "their parent, whichever pass found them; kept, that is one stat file, command "
            "line and executable link each, and what may change.\n",
            render_idle(results.idle),
            "",
            f"Noticing a new exo: {rounds} rounds per scan, the {len(VARIANTS)} side by side in "
            f"namespaces of their own with {LOAD:,} `sleep`s; each round, after a random "
            f"pause of 0-{interval:g} s, starts a stand-in worker with {EXO_RUNNERS} idle "
            "runners and times from its first runner's start (`/proc` start time, 10 ms "
            "ticks) to the guardian's `watching exo <pid>` line.\n",
            render_notice(results.notice),
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.guardian_scan")
    commands = parser.add_subparsers(dest="command", required=True)
    idle = commands.add_parser("idle-child", help="one idle guardian, in its own namespace")
    notice = commands.add_parser("notice-child", help="a guardian seeing new exos")
    for child in (idle, notice):
        child.add_argument("--variant", choices=VARIANTS, required=True)
        child.add_argument("--scratch", type=Path, required=True)
        child.add_argument("--exo-python", required=True)
    idle.add_argument("--scene", choices=list(SCENES), required=True)
    idle.add_argument("--seconds", type=float, required=True)
    notice.add_argument("--rounds", type=int, required=True)
    arguments = parser.parse_args()
    command: str = arguments.command
    variant: Variant = arguments.variant
    scratch: Path = arguments.scratch
    exo_python: str = arguments.exo_python
    if command == "idle-child":
        scene: Scene = arguments.scene
        seconds: float = arguments.seconds
        print(json.dumps(idle_child(variant, scene, seconds, scratch, exo_python)), flush=True)
    else:
        rounds: int = arguments.rounds
        print(json.dumps(notice_child(variant, rounds, scratch, exo_python)), flush=True)


if __name__ == "__main__":
    main()
