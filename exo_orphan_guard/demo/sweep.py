"""`make demo`, the other half: a crash from before the guard, and the operator's tools.

An unguarded worker (the guard off, as before this package was installed) runs from an
environment that looks like exo's and has two runners: an idle one, and rank 0 of an
MLX group waiting inside `mx.distributed.init()` for its peer. It is SIGKILLed. The
real command line lists the orphans and explains the error the next runner would hit.
Then a new worker starts with the guard on: its start-up sweep (the one exo's worker
hook, `guard_exo_worker()`, runs) ends the leftovers (SIGINT: they unwind through
Python) and logs them, and the next group forms on the same ports. `doctor` closes
the demo.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from ..rig import ring_ports, ring_scenario
from ..rig.scenarios import alive, describe_process
from ..rig.stand_in_exo import make_exo_environment
from ..system import settings
from ..system.identity import ProcessIdentity

RTR_ERROR: Final = "[jaccl] Changing queue pair to RTR failed with errno 16"
GROUP_TIMEOUT_SECONDS: Final = 20.0
CLI_TIMEOUT_SECONDS: Final = 30.0
_INDENT: Final = "    "


def startup_sweep(scratch: Path) -> bool:
    title("4. A crash from before the guard: the start-up sweep cleans up before the next group")
    directory = scratch / "sweep"
    directory.mkdir()
    registry = scratch / "registry"
    python = make_exo_environment(directory / "exo-venv")
    mlx = ring_scenario.mlx_available()
    if not mlx:
        print("(mlx is not installed: idle runners stand in for the MLX ranks)")
    ranks = [0] if mlx else []
    hostfile = ring_ports.write_hostfile(directory, ring_ports.free_loopback_ports(2))
    old = ring_scenario.start_group(
        ranks, hostfile, guard=False, registry=registry, idle_runners=1 if mlx else 2, python=python
    )
    new: ring_scenario.RunningGroup | None = None
    try:
        leftovers = _orphan(old, python)
        _show_cli(["scan"], registry, guard=False)
        print(f"The demo's orphans: {_names(old)}.")
        print("\nOn a Mac with RDMA, the next runner on this node would now fail like this:")
        _show_cli(["explain", RTR_ERROR], registry, guard=False)
        print("\nA new worker starts with the guard on (EXO_ORPHAN_GUARD=1). Its first act is")
        print("the start-up sweep, as exo's worker hook guard_exo_worker() runs it (without")
        print("it, the new group would hang on the orphan as in section 3). exo's log:")
        started_at = time.monotonic()
        new = ring_scenario.start_group(
            [1, 0] if mlx else [],
            hostfile,
            guard=True,
            registry=registry,
            stagger=ring_scenario.NEXT_GROUP_STAGGER_SECONDS,
            idle_runners=0 if mlx else 1,
            sweep_first=True,
            python=python,
        )
        for line in new.logs:
            print(f"{_INDENT}{line['level']:<8} {line['message']}")
        survivors = alive(leftovers)
        if survivors:
            print(f"FAIL: still alive after the sweep: {', '.join(map(_pid, survivors))}")
        else:
            print("Both leftovers are gone.")
        _taken_by_others(leftovers, new.logs)
        if not mlx:
            return not survivors
        formed = ring_scenario.wait_for_sums(new, 2, GROUP_TIMEOUT_SECONDS)
        elapsed = time.monotonic() - started_at
        if formed:
            sums = ", ".join(f"rank {rank}: {value:g}" for rank, value in sorted(new.sums.items()))
            print(
                f"The next group formed on the same ports: all_sum = {sums} (expected 3).\n"
                f"New worker started -> group formed: {elapsed:.1f} s, sweep included."
            )
        else:
            print(f"FAIL: the next group did not form within {GROUP_TIMEOUT_SECONDS:g} s")
        return formed and not survivors
    finally:
        ring_scenario.stop(old)
        if new is not None:
            ring_scenario.stop(new)


def doctor(scratch: Path) -> None:
    """Shown, never a failure of the demo: the node may hold problems that are not its."""
    title("6. exo-orphan-guard doctor: this node on one screen")
    if _show_cli(["doctor"], scratch / "registry", guard=True) != 0:
        print("doctor found a problem on this node (FAIL lines above); the demo's own")
        print("processes are all gone, so it predates or runs beside the demo.")


def _orphan(group: ring_scenario.RunningGroup, python: str) -> list[ProcessIdentity]:
    """SIGKILL the worker's pid alone, once its rank is inside init; the orphans."""
    runners = ", ".join(
        [
            *(f"{_pid(identity)} (idle: another model's runner)" for identity in group.idle),
            *(
                f"{_pid(identity)} (MLX rank {rank}: waits in mx.distributed.init() "
                "for rank 1, on a node that is not up yet)"
                for rank, identity in group.ranks.items()
            ),
        ]
    )
    print(f"exo environment (stand-in: a venv with exo's dist-info): {python}")
    print(f"worker {group.process.pid} (guard off) spawned runners {runners}")
    time.sleep(ring_ports.IN_INIT_SETTLE_SECONDS)
    group.process.kill()
    group.process.wait()
    orphans = alive(group.runners)
    parents = sorted({str(describe_process(identity)["ppid"]) for identity in orphans})
    print(
        f"kill -9 {group.process.pid}: {len(orphans)} runner(s) live on "
        f"(parent now {', '.join(parents) or '-'})."
    )
    return orphans


def _taken_by_others(leftovers: list[ProcessIdentity], logs: list[ring_scenario.LogReport]) -> None:
    """Sweeps are machine-wide: another one (a test suite running beside the demo, an
    operator's) may have killed an orphan before the start-up sweep could. Say so."""
    reported = " ".join(line["message"] for line in logs)
    others = [
        identity
        for identity in leftovers
        if re.search(rf"\borphan {identity.pid}\b", reported) is None
    ]
    if others:
        print(
            f"note: {', '.join(map(_pid, others))} did not wait for this sweep: another sweep "
            f"running on this machine took {'it' if len(others) == 1 else 'them'} first."
        )


def _show_cli(arguments: list[str], registry: Path, *, guard: bool) -> int:
    """Run the real command line as an operator would, and show what it printed."""
    env = dict(os.environ)
    env[settings.DIR_ENV] = str(registry)
    env[settings.TOGGLE_ENV] = "1" if guard else "0"
    prefix = f"{settings.TOGGLE_ENV}=1 " if guard else ""
    print(f"\n$ {prefix}exo-orphan-guard {shlex.join(arguments)}", flush=True)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "exo_orphan_guard", *arguments],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=CLI_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"{_INDENT}FAIL: no answer within {CLI_TIMEOUT_SECONDS:g} s")
        return 1
    for line in (completed.stdout + completed.stderr).rstrip("\n").splitlines():
        print(f"{_INDENT}{line}")
    print(f"{_INDENT}(exit code {completed.returncode})")
    return completed.returncode


def _names(group: ring_scenario.RunningGroup) -> str:
    named = [
        *(f"{_pid(identity)} (idle runner)" for identity in group.idle),
        *(f"{_pid(identity)} (rank {rank} in init)" for rank, identity in group.ranks.items()),
    ]
    return ", ".join(named)


def _pid(identity: ProcessIdentity) -> str:
    return str(identity.pid)


def title(text: str) -> None:
    print(f"\n== {text} ==", flush=True)
