"""`make soak`: the guardian under an hour of exo churn, its memory, descriptors,
threads and files sampled; it fails if any grows past its slack (`DESCRIPTION`)."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final

from exo_orphan_guard.records import handover_marker
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.stand_in_exo import make_exo_environment
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity

from .document import header, machine
from .guardian_process import status_kib

DESCRIPTION: Final = (
    "In the pid namespace `scripts/confined` makes: a guardian (`service run --mode "
    "service`, its stderr appended to `guardian.log` in the registry, as launchd keeps "
    "it) with its own registry and guardian directory, at its defaults but a grace of "
    "2 s; in a loop, two exo-shaped stand-in workers with two idle runners each (one "
    "round in three with a hand-over marker, as exo's hooks write it) live a random "
    "0-3 s and are SIGKILLed, and every runner must be gone within 30 s, a pause of 1 s "
    "between rounds. In the first half the guardian itself is SIGKILLed 6 times, a "
    "round's workers killed while it is down, then started again (its start-up sweep "
    "ends their runners). The second half runs one guardian throughout, and is what the "
    "checks judge: its first and last windows (a sixth of the half each, the first "
    "after a warm-up) must not differ by more than the slack, and the files never "
    "exceed their bound. A round whose stand-in did not start (its report not within "
    "60 s: the machine, not the guardian) is not run, and counted."
)
RESTARTS: Final = 6
SAMPLE_SECONDS: Final = 30.0
GONE_TIMEOUT_S: Final = 30.0
MARKER_EVERY: Final = 3
PAUSE_S: Final = 1.0
"""Between rounds: the machine is shared."""
GRACE_S: Final = 2.0
"""The hand-over grace (`EXO_ORPHAN_GUARD_GRACE`): short, so that rounds keep coming."""
RSS_SLACK_MIB: Final = 3.0
FDS_SLACK: Final = 3
THREADS_SLACK: Final = 3
FILES_BOUND_KIB: Final = 2048
"""`endings.jsonl` is cut past 512 KiB, the log past 1 MiB; the rest is a few lines."""
MAX_UNSTARTED: Final = 10
"""Rounds not run before the soak gives up: past this, something else is wrong."""


@final
@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    """Seconds since the soak began."""
    guardian: int
    restarts: int
    rss_kib: int
    fds: int
    threads: int
    files_bytes: int
    starts: int
    ended: int
    leftovers: int


@final
@dataclass(slots=True)
class _Counts:
    restarts: int = 0
    starts: int = 0
    ended: int = 0
    leftovers: int = 0
    unstarted: int = 0
    guardian: subprocess.Popen[bytes] | None = None
    samples: list[Sample] = field(default_factory=list[Sample])


@final
@dataclass(frozen=True, slots=True)
class SoakResult:
    seconds: float
    samples: tuple[Sample, ...]
    problems: tuple[str, ...]
    unstarted: int
    """Rounds not run: a stand-in did not start."""


def run(seconds: float, scratch: Path) -> SoakResult:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started in the background by a shell: the stand-ins would inherit it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    exo_python = make_exo_environment(scratch / "exo-venv")
    registry, home = scratch / "registry", scratch / "user"
    env = _environment(scratch, registry, home)
    counts = _Counts()
    began = time.monotonic()
    restart_at = [began + seconds / 2 * (n + 1) / (RESTARTS + 1) for n in range(RESTARTS)]
    stop = threading.Event()
    sampler = threading.Thread(
        target=_sample_every, args=(counts, began, (registry, home), stop), daemon=True
    )
    counts.guardian = _start_guardian(env, registry)
    sampler.start()
    try:
        rounds = 0
        while time.monotonic() - began < seconds:
            if restart_at and time.monotonic() >= restart_at[0]:
                restart_at.pop(0)
                _round_while_down(counts, env, registry, exo_python)
            else:
                _round(counts, registry, exo_python, marked=rounds % MARKER_EVERY == 0)
            rounds += 1
            time.sleep(PAUSE_S)
    finally:
        stop.set()
        sampler.join()
        _stop(counts.guardian)
    problems = tuple(judge(counts.samples, seconds))
    return SoakResult(seconds, tuple(counts.samples), problems, counts.unstarted)


def _environment(scratch: Path, registry: Path, home: Path) -> dict[str, str]:
    env = {**os.environ}
    for name in (settings.SCAN_INTERVAL_ENV, settings.BUSY_WAIT_ENV, settings.BACKEND_ENV):
        env.pop(name, None)
    env.pop(settings.EXO_HOME_ENV, None)
    env[settings.DIR_ENV] = str(registry)
    env[settings.USER_DIR_ENV] = str(home)
    env[settings.XDG_CACHE_ENV] = str(scratch / "cache")
    env[settings.GRACE_ENV] = f"{GRACE_S:g}"
    return env


def _start_guardian(env: dict[str, str], registry: Path) -> subprocess.Popen[bytes]:
    registry.mkdir(mode=0o700, exist_ok=True)
    log = os.open(registry / "guardian.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "exo_orphan_guard", "service", "run", "--mode", "service"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
    finally:
        os.close(log)


def _stop(guardian: subprocess.Popen[bytes] | None) -> None:
    if guardian is None or guardian.poll() is not None:
        return
    guardian.send_signal(signal.SIGTERM)
    try:
        guardian.wait(15)
    except subprocess.TimeoutExpired:
        guardian.kill()
        guardian.wait()


def _round(counts: _Counts, registry: Path, exo_python: str, *, marked: bool) -> None:
    workers = _start_workers(counts, registry, exo_python, marked=marked)
    if workers is None:
        return
    try:
        time.sleep(random.uniform(0.0, 3.0))
        _kill_and_count(counts, workers)
    finally:
        for worker in workers:
            scenarios.cleanup(worker)


def _round_while_down(
    counts: _Counts, env: dict[str, str], registry: Path, exo_python: str
) -> None:
    """SIGKILL the guardian, then a round's workers; its successor's start-up sweep
    ends their runners."""
    assert counts.guardian is not None
    counts.guardian.kill()
    counts.guardian.wait()
    workers = _start_workers(counts, registry, exo_python, marked=True) or []
    try:
        for worker in workers:
            scenarios.kill_worker(worker)
        counts.guardian = _start_guardian(env, registry)
        counts.restarts += 1
        _kill_and_count(counts, workers)
    finally:
        for worker in workers:
            scenarios.cleanup(worker)


def _start_workers(
    counts: _Counts, registry: Path, exo_python: str, *, marked: bool
) -> list[scenarios.StartedWorker] | None:
    """A round's two workers; None if one did not start (`start_worker` has ended it,
    and those started before it are cleaned up here): the round is not run."""
    workers: list[scenarios.StartedWorker] = []
    for index in range(2):
        try:
            worker = scenarios.start_worker(
                ["idle", "idle"], watch="none", python=exo_python, registry=registry
            )
        except RuntimeError as error:
            for started in workers:
                scenarios.cleanup(started)
            counts.unstarted += 1
            print(f"  soak: a round not run ({error})", flush=True)
            if counts.unstarted > MAX_UNSTARTED:
                raise
            return None
        workers.append(worker)
        counts.starts += 1
        if marked and index == 0:
            _mark(registry, worker.pid)
    return workers


def _mark(base: Path, pid: int) -> None:
    """What exo's in-tree hooks write at its worker's start (their own code, as is)."""
    path = handover_marker.marker_path(base, pid)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    temporary = path.with_name(f".{pid}.tmp")
    temporary.write_text(json.dumps({"pid": pid, "at": time.time()}))
    temporary.chmod(0o600)
    os.replace(temporary, path)


def _kill_and_count(counts: _Counts, workers: Sequence[scenarios.StartedWorker]) -> None:
    runners: list[ProcessIdentity] = [r.identity for w in workers for r in w.runners]
    for worker in workers:
        if worker.process.poll() is None:
            scenarios.kill_worker(worker)
    exits = scenarios.wait_gone(runners, GONE_TIMEOUT_S)
    counts.ended += sum(at is not None for at in exits.values())
    counts.leftovers += sum(at is None for at in exits.values())


def _sample_every(
    counts: _Counts, began: float, places: tuple[Path, Path], stop: threading.Event
) -> None:
    while not stop.wait(SAMPLE_SECONDS):
        guardian = counts.guardian
        if guardian is None or guardian.poll() is not None:
            continue
        try:
            sample = Sample(
                at=time.monotonic() - began,
                guardian=guardian.pid,
                restarts=counts.restarts,
                rss_kib=status_kib(guardian.pid, "VmRSS"),
                fds=len(os.listdir(f"/proc/{guardian.pid}/fd")),
                threads=status_kib(guardian.pid, "Threads"),
                files_bytes=sum(_bytes_under(place) for place in places),
                starts=counts.starts,
                ended=counts.ended,
                leftovers=counts.leftovers,
            )
        except OSError:  # killed between the look and the reads
            continue
        counts.samples.append(sample)


def _bytes_under(root: Path) -> int:
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return total


def judge(samples: Sequence[Sample], seconds: float) -> list[str]:
    """What grew past its slack in the second half, or went past its bound anywhere."""
    problems: list[str] = []
    last = samples[-1] if samples else None
    if last is None:
        return ["no sample was taken"]
    if last.leftovers:
        problems.append(f"{last.leftovers} runner(s) outlived the churn by {GONE_TIMEOUT_S:g} s")
    files = max(sample.files_bytes for sample in samples)
    if files > FILES_BOUND_KIB * 1024:
        problems.append(f"the files reached {files / 1024:.0f} KiB (bound {FILES_BOUND_KIB})")
    settled = [sample for sample in samples if sample.restarts == RESTARTS]
    half = seconds / 2
    window = max(SAMPLE_SECONDS * 2, half / 6)
    start = half + half / 15
    first = [sample for sample in settled if start <= sample.at < start + window]
    final = [sample for sample in settled if sample.at >= seconds - window]
    if len(first) < 2 or len(final) < 2 or first[-1].at >= final[0].at:
        return [*problems, "too few samples in the second half to judge (a longer soak)"]
    rss = statistics.median(s.rss_kib for s in final) - statistics.median(s.rss_kib for s in first)
    if rss > RSS_SLACK_MIB * 1024:
        problems.append(f"RSS grew {rss / 1024:.1f} MiB (slack {RSS_SLACK_MIB:g})")
    for name, slack in (("fds", FDS_SLACK), ("threads", THREADS_SLACK)):
        grew = max(getattr(s, name) for s in final) - max(getattr(s, name) for s in first)
        if grew > slack:
            problems.append(f"{name} grew by {grew} (slack {slack})")
    return problems


def render(result: SoakResult, rows: int = 12) -> str:
    samples = result.samples
    step = max(1, len(samples) // rows)
    shown = [*samples[::step]]
    if samples and shown[-1] is not samples[-1]:
        shown.append(samples[-1])
    lines = [
        "| minute | guardian (restarts) | RSS MiB | fds | threads | files KiB "
        "| exo starts | runners ended | left behind |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for sample in shown:
        lines.append(
            f"| {sample.at / 60:.1f} | {sample.guardian} ({sample.restarts}) "
            f"| {sample.rss_kib / 1024:.1f} | {sample.fds} | {sample.threads} "
            f"| {sample.files_bytes / 1024:.0f} | {sample.starts} | {sample.ended} "
            f"| {sample.leftovers} |"
        )
    verdict = "; ".join(result.problems) if result.problems else "flat: nothing grew past its slack"
    unstarted = f"Rounds not run because a stand-in did not start: {result.unstarted}."
    return "\n".join([*lines, "", f"Verdict: {verdict}. {unstarted}"])


def section(arguments: argparse.Namespace, scratch: Path) -> str:
    seconds: float = arguments.soak_seconds
    where = machine()
    result = run(seconds, scratch)
    text = "\n".join(
        [
            header(
                "The guardian left running: an hour of exo churn (`make soak`)",
                f"make soak SOAK_SECONDS={seconds:g}",
                where,
            ),
            f"{DESCRIPTION} Sampled every {SAMPLE_SECONDS:g} s "
            "(`/proc/<pid>/status` VmRSS and Threads, `/proc/<pid>/fd`; files: the "
            "lengths of every file in the registry and the guardian directory). Slack: RSS "
            f"{RSS_SLACK_MIB:g} MiB (medians), fds {FDS_SLACK} and threads "
            f"{THREADS_SLACK} (maxima), files at most {FILES_BOUND_KIB} KiB, no "
            "runner left behind. Rows: every twelfth sample and the last.\n",
            render(result),
            "",
        ]
    )
    if result.problems:
        print(text, flush=True)
        sys.exit(f"soak: {'; '.join(result.problems)}")
    return text
