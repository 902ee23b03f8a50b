"""What 10,000 exo starts leave on disk: the registry and the user's guardian directory,
without the guardian's upkeep (as before) and with it.

Simulated, on the real writers, in a virtual clock (one exo start every
`STEP_SECONDS`): months of starts in seconds. Each start is what one exo start with two
runners, then its SIGKILL, leaves behind when a guardian ends its runners: exo's
hand-over marker (written as exo's in-tree hooks write it), the worker's watch request,
the guardian's log lines, and for each runner the guardian's `begun` and `ended` lines
(in the registry's `endings.jsonl`, the `begun` one in the user's record too). One exo
in `UNWATCHED_EVERY` dies while no guardian runs (its marker is not removed at its
death). Its pids are above any pid in use here: every process they name is gone.
With upkeep, each start is followed by a scan's pruning of the watch requests, and
every `UPKEEP_EVERY_STARTS` starts (a minute) by `guardian.upkeep`; the log is kept
by `guardian.log` as the guardian writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from exo_orphan_guard.guardian import log
from exo_orphan_guard.guardian.upkeep import upkeep
from exo_orphan_guard.records import begun_record, endings, handover_marker, watch_requests
from exo_orphan_guard.records.endings import Ending
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.system import boot_id, settings
from exo_orphan_guard.system.identity import ProcessIdentity
from exo_orphan_guard.system.process_facts import Pid

from .document import header

STEP_SECONDS: Final = 6.0
UPKEEP_EVERY_STARTS: Final = 10
UNWATCHED_EVERY: Final = 10
RUNNERS_PER_START: Final = 2
FIRST_PID: Final = 4_000_000
"""Above the pids of a fresh pid namespace, below Linux's pid_max (4,194,304)."""
SAMPLE_EVERY: Final = 100


@final
@dataclass(frozen=True, slots=True)
class Sizes:
    endings: int
    markers: int
    marker_files: int
    log: int
    begun: int
    requests: int

    @property
    def total(self) -> int:
        return self.endings + self.markers + self.log + self.begun + self.requests


@final
@dataclass(frozen=True, slots=True)
class Growth:
    starts: int
    final: Sizes
    largest_total: int


def simulate(starts: int, scratch: Path, *, with_upkeep: bool) -> Growth:
    base, home = _places(scratch / ("with" if with_upkeep else "without"))
    registry, problem = Registry.open(base, create=True)
    assert registry is not None, problem
    boot = boot_id()
    log_path = home / "guardian.log"
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    clock, wall = time.monotonic(), time.time()
    largest = 0
    try:
        for start in range(starts):
            clock, wall = clock + STEP_SECONDS, wall + STEP_SECONDS
            worker = ProcessIdentity(Pid(FIRST_PID + start), 1.0 + start)
            _exo_starts(base, home, worker, wall, with_upkeep)
            _guardian_ends(registry.path, home, worker, boot, clock, wall, log_fd, with_upkeep)
            if start % UNWATCHED_EVERY != 0:
                handover_marker.remove(base, worker.pid)  # its watched death
            if with_upkeep:
                watch_requests.live_requests(home)  # the next scan's
                if start % UPKEEP_EVERY_STARTS == 0:
                    upkeep(base, home, boot, wall, clock)
            if start % SAMPLE_EVERY == 0:
                largest = max(largest, _sizes(registry.path, base, home).total)
    finally:
        os.close(log_fd)
    final = _sizes(registry.path, base, home)
    return Growth(starts, final, max(largest, final.total))


def _places(root: Path) -> tuple[Path, Path]:
    """A registry base, and a guardian directory as `user_dir` makes one."""
    home = root / "user" / "host-simulated"
    home.mkdir(mode=0o700, parents=True)
    return root / "registry", home


def _exo_starts(
    base: Path, home: Path, worker: ProcessIdentity, wall: float, with_upkeep: bool
) -> None:
    """exo's in-tree hooks write the marker (their own code, as it is), and the
    worker's `ensure_guardian` its request (which did not exist before)."""
    directory = base / handover_marker.DIRECTORY_NAME
    directory.mkdir(mode=0o700, exist_ok=True)
    temporary = directory / f".{worker.pid}.tmp"
    temporary.write_text(json.dumps({"pid": worker.pid, "at": wall}))
    os.replace(temporary, handover_marker.marker_path(base, worker.pid))
    if with_upkeep:
        watch_requests.request(home, worker)


def _guardian_ends(
    directory: Path,
    home: Path,
    worker: ProcessIdentity,
    boot: str,
    clock: float,
    wall: float,
    log_fd: int,
    with_upkeep: bool,
) -> None:
    lines = [
        f"watching exo {worker.pid} ({RUNNERS_PER_START} runner(s))",
        f"exo {worker.pid} exited: ending its {RUNNERS_PER_START} runner(s): SIGINT",
    ]
    for index in range(RUNNERS_PER_START):
        runner = ProcessIdentity(Pid(worker.pid * 10 + index), worker.started + 0.5)
        begun = Ending(
            event="begun",
            pid=runner.pid,
            started=runner.started,
            boot_id=boot,
            at=wall,
            by="guardian",
            why="the guardian's SIGINT; SIGKILL at the deadline if it is still there",
            deadline=clock + settings.DEFAULT_BUSY_WAIT_SECONDS,
        )
        endings.append(directory / endings.ENDINGS_NAME, begun)
        if with_upkeep:
            begun_record.append(home, begun)
        ended = Ending(
            event="ended",
            pid=runner.pid,
            started=runner.started,
            boot_id=boot,
            at=wall + 0.5,
            by="guardian",
            how="clean",
            after_seconds=0.45,
            why="the guardian's SIGINT",
            step="interrupt",
            signal="SIGINT",
        )
        endings.append(directory / endings.ENDINGS_NAME, ended)
        lines.append(f"exo {worker.pid} exited: runner {runner.pid} ended clean (SIGINT)")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(wall))
    for line in lines:
        text = f"{stamp} exo-orphan-guard guardian: {line}\n"
        if with_upkeep:
            log.write_line(text, log_fd)
        else:
            os.write(log_fd, text.encode())


def _sizes(directory: Path, base: Path, home: Path) -> Sizes:
    markers = base / handover_marker.DIRECTORY_NAME
    marker_names = os.listdir(markers) if markers.is_dir() else []
    requests = home / watch_requests.DIRECTORY_NAME
    return Sizes(
        endings=_size(directory / endings.ENDINGS_NAME),
        markers=sum(_size(markers / name) for name in marker_names),
        marker_files=len(marker_names),
        log=_size(home / "guardian.log"),
        begun=_size(home / begun_record.NAME),
        requests=sum(_size(requests / name) for name in os.listdir(requests))
        if requests.is_dir()
        else 0,
    )


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def render(without: Growth, with_upkeep: Growth) -> str:
    rows = [
        ("`endings.jsonl` (registry)", "endings"),
        ("hand-over markers (registry)", "markers"),
        ("`guardian.log`", "log"),
        ("`begun.jsonl` (guardian directory)", "begun"),
        ("watch requests (guardian directory)", "requests"),
    ]
    lines = [
        f"| after {without.starts:,} exo starts | without upkeep (before) | "
        "with the guardian's upkeep |",
        "|---|---:|---:|",
    ]
    for label, field in rows:
        before, after = getattr(without.final, field), getattr(with_upkeep.final, field)
        lines.append(f"| {label} | {_kib(before)} | {_kib(after)} |")
    lines.append(
        f"| hand-over marker files | {without.final.marker_files:,} | "
        f"{with_upkeep.final.marker_files:,} |"
    )
    lines.append(
        f"| **all of it** | **{_kib(without.final.total)}** | **{_kib(with_upkeep.final.total)}** |"
    )
    lines.append(
        f"| the most at any sample (every {SAMPLE_EVERY} starts) | "
        f"{_kib(without.largest_total)} | {_kib(with_upkeep.largest_total)} |"
    )
    return "\n".join(lines)


def _kib(size: int) -> str:
    return f"{size / 1024:,.1f} KiB"


def section(arguments: argparse.Namespace, scratch: Path) -> str:
    starts: int = arguments.registry_starts
    without = simulate(starts, scratch, with_upkeep=False)
    with_upkeep = simulate(starts, scratch, with_upkeep=True)
    return "\n".join(
        [
            header(
                "The guardian's files after months of exo starts",
                f"python -m bench.run_all --only registry --registry-starts {starts}",
            ),
            f"{starts:,} simulated exo starts, one every {STEP_SECONDS:g} s "
            f"of a virtual clock ({starts * STEP_SECONDS / 3600:.0f} hours "
            f"of starts), each with {RUNNERS_PER_START} runners ended "
            "by the guardian after exo's SIGKILL: exo's hand-over marker, the worker's watch "
            "request, the guardian's log lines, and each runner's `begun` and `ended` lines, "
            "written by the real writers (`bench/py`); one exo in "
            f"{UNWATCHED_EVERY} dies while no guardian runs, its marker "
            "left. Without upkeep is the guardian before issue 40 (markers removed only at a "
            "watched death, `endings.jsonl` compacted only by sweeps, the log never cut); "
            "with it, each start is followed by a scan's pruning of the watch requests and, "
            f"every {UPKEEP_EVERY_STARTS} starts (a minute), by "
            "`guardian.upkeep`; the log is cut at 1 MiB to its newest 256 KiB. Sizes are "
            "the files' lengths.\n",
            render(without, with_upkeep),
            "",
        ]
    )
