"""`make demo`: the orphan problem and the fix, side by side, on this machine.

A stand-in worker with runners (one idle, one holding the GIL in native code that
never returns) is hard-killed twice: first with the guard off, then on, beside a
runner busy in one long `mx.eval` (waited for, then ending cleanly); then a real MLX
group. The start-up sweep and the operator's tools follow (`demo_sweep`). Everything
it starts is killed on the way out, whatever happens (errors, Ctrl-C, SIGTERM).
`python -m exo_orphan_guard.demo 4 6` shows only those sections (numbered as shown).
Exit code: 0 when every section showed what it should, 1 otherwise, 130 interrupted,
2 for a section that does not exist.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Final

from .. import system
from ..records import endings
from ..records.endings import Ending
from ..records.registry import host_directory
from ..rig import ring_scenario, scenarios
from ..rig.notes import read_notes
from ..rig.runner_kinds import RunnerKind
from ..rig.scenario_worker import Watch
from ..system import settings
from ..system.identity import ProcessIdentity
from . import launch, sweep

ORPHAN_LOOK_SECONDS = 1.0
MLX_HANG_TIMEOUT_SECONDS = 6.0
DEMO_BUSY_WAIT_SECONDS = 15.0
"""The demo's busy wait (the default is 120 s): long enough for its long eval (sized to
3 s, and 8 s was outgrown once beside `make test`'s four jobs), short enough to show
the truly wedged runner killed at it."""


Section = Callable[[Path], bool | None]
"""Shows one part on this machine; False when it did not go as it should."""


def main(argv: Sequence[str] | None = None) -> int:
    sections: list[Section] = [
        _round_guard_off,
        _round_guard_on,
        _mlx_group,
        sweep.startup_sweep,
        launch.launcher_killed,
        sweep.doctor,
    ]
    parser = argparse.ArgumentParser(
        prog="python -m exo_orphan_guard.demo", description="make demo: the problem and the fix"
    )
    parser.add_argument(
        "only",
        nargs="*",
        type=int,
        metavar="SECTION",
        help=f"show only these sections (1-{len(sections)}); default: all",
    )
    chosen: list[int] = parser.parse_args(argv).only
    for number in chosen:
        if not 1 <= number <= len(sections):
            parser.error(f"no section {number}: the demo has sections 1-{len(sections)}")
    if chosen:
        sections = [section for number, section in enumerate(sections, 1) if number in chosen]
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="eog-demo-") as scratch:
        try:
            for section in sections:
                if section(Path(scratch)) is False:
                    failed.append(section.__name__.strip("_"))
        except KeyboardInterrupt:
            print("\ninterrupted: cleaned up", file=sys.stderr)
            return 130
    if failed:
        print(f"\ndemo: FAIL in {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _round_guard_off(scratch: Path) -> None:
    _title("1. Guard off: the worker is hard-killed (SIGKILL), as by a crash or force-quit")
    with _Worker("none", scratch) as worker:
        _show_start(worker)
        scenarios.kill_worker(worker)
        print(f"kill -9 {worker.pid}; {ORPHAN_LOOK_SECONDS:g} s later:")
        time.sleep(ORPHAN_LOOK_SECONDS)
        orphans = scenarios.alive(worker.all_processes())
        print(f"{len(orphans)} orphaned runner(s) still running:")
        print(f"  {'pid':>7} {'ppid':>7} {'RSS MiB':>8} {'age s':>7}  state")
        for identity in orphans:
            row = scenarios.describe_process(identity)
            print(
                f"  {row['pid']:>7} {row['ppid']!s:>7} {row['rss_mib']!s:>8} "
                f"{row['age_s']!s:>7}  {row['state']}"
            )
        print("On a Mac each would keep its Metal memory and RDMA queue pairs, and the")
        print("next runner would fail with '[jaccl] Changing queue pair to RTR failed with")
        print("errno 16'. (The demo kills them now.)")


def _round_guard_on(scratch: Path) -> bool:
    busy: RunnerKind = "mlxbusy" if ring_scenario.mlx_available() else "gilbusy"
    _title(
        f"2. Guard on (EXO_ORPHAN_GUARD=1, {settings.BUSY_WAIT_ENV}="
        f"{DEMO_BUSY_WAIT_SECONDS:g}): the same kill, and a runner busy in native code"
    )
    notes = scratch / "notes"
    notes.mkdir(exist_ok=True)
    with _Worker("guard", scratch, ["idle", busy, "gil"], notes) as worker:
        _show_start(worker)
        members = worker.all_processes()
        busy_runner = next(r.identity for r in worker.runners if r.kind == busy)
        _wait_until_busy(notes, busy_runner, busy)
        killed_at = scenarios.kill_worker(worker)
        exits = scenarios.wait_gone(
            members, DEMO_BUSY_WAIT_SECONDS + settings.DEFAULT_GRACE_SECONDS + 2.0
        )
        print(f"kill -9 {worker.pid}:")
        recorded = _endings(scratch / "registry", [runner.identity for runner in worker.runners])
        expected = {"idle": "clean", busy: "clean", "gil": "killed"}
        as_expected = True
        for runner in worker.runners:
            seen = exits[runner.identity]
            outcome = (
                "STILL ALIVE"
                if seen is None
                else f"gone {(seen - killed_at) * 1000:.0f} ms after the kill"
            )
            if seen is not None and runner.kind == busy:
                returned = _noted(notes, runner.identity, "raised")
                if returned is not None:
                    outcome += f", {(seen - returned) * 1000:.0f} ms after its call returned"
            ending = recorded.get(runner.identity)
            if ending is None:
                how = "no ending recorded"
            elif ending.how is None:
                how = "its clean ending under way"
            else:
                how = _ENDED[ending.how]
            print(f"  runner {runner.identity.pid} ({_WHAT[runner.kind]}): {outcome}: {how}")
            if ending is not None:
                print(f"    ({ending.why})")
            as_expected = as_expected and ending is not None and ending.how == expected[runner.kind]
        print(
            "The idle runner ended the way exo's Shutdown ends one (WorkerGone on its main\n"
            "thread, memory released, its own exit). The busy one was waited for: its call\n"
            "returned, then it ended the same way. The wedged one never came back to Python,\n"
            f"so it was killed at the busy wait ({DEMO_BUSY_WAIT_SECONDS:g} s here, 120 s by "
            "default;\n`exo-orphan-guard sweep --now` ends such a runner sooner)."
        )
        left = scenarios.alive(members)
        print("No orphans left." if not left else f"{len(left)} process(es) left: FAIL")
        if not as_expected:
            print("FAIL: the runners did not end as shown above should")
        return not left and as_expected


_ENDED: Final = {"clean": "ended cleanly, by itself", "killed": "killed as wedged"}
_WHAT: Final[dict[RunnerKind, str]] = {
    "idle": "idle",
    "mlxbusy": "inside one long mx.eval",
    "gilbusy": "in native code holding the GIL, returning after 1.5 s",
    "gil": "holding the GIL in native code, never returning",
}


def _wait_until_busy(notes: Path, runner: ProcessIdentity, kind: RunnerKind) -> None:
    """Until the busy runner is inside its call (for MLX: one of full length)."""
    event = "eval begun" if kind == "mlxbusy" else "native begun"
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        found = [
            note
            for note in read_notes(notes, runner.pid)
            if note["event"] == event and note.get("sized", True)
        ]
        if found:
            time.sleep(0.2)
            return
        time.sleep(0.02)


def _noted(notes: Path, runner: ProcessIdentity, event: str) -> float | None:
    found = [note["at"] for note in read_notes(notes, runner.pid) if note["event"] == event]
    return found[-1] if found else None


def _endings(registry: Path, runners: list[ProcessIdentity]) -> dict[ProcessIdentity, Ending]:
    """What the runners' watchdogs recorded (a line lands a moment after each exit)."""
    path = host_directory(registry) / endings.ENDINGS_NAME
    deadline = time.monotonic() + 2.0
    while True:
        latest = endings.latest(endings.read(path, system.boot_id()))
        found = {runner: latest[runner] for runner in runners if runner in latest}
        done = len(found) == len(runners) and all(e.event == "ended" for e in found.values())
        if done or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _mlx_group(scratch: Path) -> bool:
    _title(
        "3. A real MLX group (ring backend, loopback): a rank is inside "
        "mx.distributed.init() when its worker is killed; then the next group starts"
    )
    if not ring_scenario.mlx_available():
        print("skipped: mlx is not installed (pip install 'mlx[cpu]' on Linux)")
        return True
    formed_with_guard = False
    for guard in (False, True):
        outcome = ring_scenario.orphan_then_next_group(
            guard=guard, timeout=MLX_HANG_TIMEOUT_SECONDS, scratch=scratch
        )
        label = "guard on: " if guard else "guard off:"
        if outcome.orphan_gone_ms is None:
            orphan = "the rank outlived its worker"
        else:
            orphan = f"the rank was gone {outcome.orphan_gone_ms:.1f} ms after the kill"
        if outcome.formed:
            sums = ", ".join(
                f"rank {rank}: {value:g}" for rank, value in sorted(outcome.sums.items())
            )
            result = (
                f"next group formed {outcome.form_seconds:.1f} s after the kill, "
                f"all_sum = {sums} (expected 3)"
            )
        else:
            result = (
                f"next group HUNG: no all_sum within {MLX_HANG_TIMEOUT_SECONDS:g} s "
                "(its rank 1 joined the orphan; rank 0 waits forever)"
            )
        print(f"{label} {orphan}; {result}")
        formed_with_guard = outcome.formed and guard
    return formed_with_guard


class _Worker:
    """Context manager: a started scenario worker, always cleaned up."""

    def __init__(
        self,
        watch: Watch,
        scratch: Path,
        kinds: Sequence[RunnerKind] = ("idle", "gil"),
        notes: Path | None = None,
    ) -> None:
        self._worker = scenarios.start_worker(
            kinds,
            watch=watch,
            registry=scratch / "registry",
            notes=notes,
            extra_env={settings.BUSY_WAIT_ENV: f"{DEMO_BUSY_WAIT_SECONDS:g}"},
        )

    def __enter__(self) -> scenarios.StartedWorker:
        return self._worker

    def __exit__(self, *_: object) -> None:
        scenarios.cleanup(self._worker)


def _show_start(worker: scenarios.StartedWorker) -> None:
    pids = ", ".join(str(runner.identity.pid) for runner in worker.runners)
    print(f"worker {worker.pid} spawned runners {pids} (multiprocessing spawn, daemon=True)")


def _title(text: str) -> None:
    print(f"\n== {text} ==", flush=True)


def _interrupt(signal_number: int, frame: FrameType | None) -> None:
    """Once: a second Ctrl-C must not cut the clean-up short."""
    del signal_number, frame
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
