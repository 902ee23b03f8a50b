"""What the guard costs exo's worker at its start and a runner at its first task
(issue 35 item 4).

Each repetition is a fresh process, as each exo start is: it loads the very modules
the two series add (against the exo-shaped rig's types), runs an anyio event loop with
a task that ticks every 10 ms, as exo's other tasks do, and awaits the local series'
`guard_worker()` with the package installed, then the PR's `end_leftover_runners()`,
as exo's `Worker.plan_step` does before its loop: the hand-over marker, the package's
start-up sweep and the PR's (nothing to end here), a guardian made sure of. Measured:
how long the plan loop waits, and how late the ticks come meanwhile (the event loop
serving). Then the PR's `watch_parent(...)` as exo's `Runner.main` calls it before it
takes its first task. Beside N unrelated processes, as `sweep_cost` does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

from exo_orphan_guard import system
from exo_orphan_guard.records import guardian_state
from exo_orphan_guard.records.user_dir import user_dir
from exo_orphan_guard.rig import exo_runner

from .stats import Samples
from .sweep_cost import UnrelatedProcesses

LOADS: Final = (0, 2000)
ROOT: Final = Path(__file__).resolve().parent.parent
_PROBE: Final = """
import json, multiprocessing, sys, time
import anyio
sys.path.insert(0, {shaped!r})
import queue
from exo.worker import orphan_guard
from exo.worker.runner import leftover_runners, parent_watch
from exo.shared.types.worker.instances import BoundInstance, Instance
from exo.utils.channels import MpReceiver, MpState

lateness = []

async def ticker():
    while True:
        asked = time.monotonic()
        await anyio.sleep(0.01)
        lateness.append((time.monotonic() - asked - 0.01) * 1000)

async def worker():
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.05)
        started = time.monotonic()
        await orphan_guard.guard_worker()
        await leftover_runners.end_leftover_runners()
        waited = (time.monotonic() - started) * 1000
        tg.cancel_scope.cancel()
    return waited

# A runner's first step, watch_parent, in a spawned child: it needs a parent to watch.
def runner(receiver, instance, out):
    work = queue.Queue()
    started = time.monotonic()
    parent_watch.watch_parent(instance, work.put)
    out.put((time.monotonic() - started) * 1000)

if __name__ == "__main__":
    waited = anyio.run(worker)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    receiver = MpReceiver(MpState())  # held: start() lets go of the child's arguments
    child = context.Process(target=runner, args=(receiver, BoundInstance(Instance("b"), "r"), out))
    child.start()
    hook = out.get(timeout=60)
    child.kill()
    child.join()
    print(json.dumps({{"waited": waited, "lateness": lateness, "runner": hook}}))
"""


@dataclass(frozen=True)
class StartResult:
    unrelated: int
    total_processes: int
    waited: Samples
    lateness: Samples
    runner: Samples
    lateness_max: float


def run(repetitions: int, scratch: Path) -> list[StartResult]:
    if not _confined():
        # Each start sweeps the machine and starts a guardian, as exo's worker does.
        raise SystemExit("bench start: run it inside scripts/confined (make bench does)")
    results: list[StartResult] = []
    for load in LOADS:
        with UnrelatedProcesses(load):
            results.append(_measure(load, repetitions, scratch))
            print(f"  worker start: {load} unrelated processes done", flush=True)
    return results


def _measure(load: int, repetitions: int, scratch: Path) -> StartResult:
    script = scratch / "worker_start_probe.py"
    script.write_text(_PROBE.format(shaped=exo_runner.EXO_SHAPED))
    registry = scratch / f"registry-{load}"
    environ = {
        **os.environ,
        "EXO_ORPHAN_GUARD": "true",
        "EXO_ORPHAN_GUARD_DIR": str(registry),
        "PYTHONPATH": str(ROOT),  # this checkout's package, whatever the venv installed
    }
    waited, lateness, runner = Samples(), Samples(), Samples()
    worst = 0.0
    for _ in range(repetitions):
        done = subprocess.run(
            [sys.executable, str(script)],
            env=environ,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        probe = cast(dict[str, object], json.loads(done.stdout.strip().splitlines()[-1]))
        waited.add(float(cast(float, probe["waited"])))
        runner.add(float(cast(float, probe["runner"])))
        for late in cast(list[float], probe["lateness"]):
            lateness.add(late)
            worst = max(worst, late)
        _stop_guardian()
    total = len(os.listdir("/proc")) if Path("/proc").is_dir() else 0
    return StartResult(load, total, waited, lateness, runner, worst)


def _confined() -> bool:
    """Whether this runs in the private pid namespace `scripts/confined` made."""
    outer = os.environ.get("EOG_OUTER_PID_NAMESPACE")
    try:
        return outer is not None and os.readlink("/proc/self/ns/pid") != outer
    except OSError:
        return False


def _stop_guardian() -> None:
    """The guardian the worker's hook started: each exo start here is a new one."""
    home, _ = user_dir(create=False)
    state = None if home is None else guardian_state.running(home, system.boot_id())
    if state is not None:
        os.kill(state.pid, signal.SIGTERM)


def render(results: list[StartResult]) -> str:
    lines = [
        "| unrelated processes | plan loop waits for the start-up sweeps, p50 / p99 ms "
        "| event loop tick lateness meanwhile, p50 / p99 / max ms "
        "| `watch_parent()` before the first task, p50 / p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for result in results:
        lines.append(
            f"| {result.unrelated} | {result.waited.quantile_text(0.5, 0)} / "
            f"{result.waited.quantile_text(0.99, 0)} | "
            f"{result.lateness.quantile_text(0.5, 0)} / "
            f"{result.lateness.quantile_text(0.99, 0)} / {result.lateness_max:.1f} | "
            f"{result.runner.quantile_text(0.5, 0)} / {result.runner.quantile_text(0.99, 0)} |"
        )
    return "\n".join(lines)
