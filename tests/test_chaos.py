"""Chaos: workers SIGKILLed at random moments, sweeps running meanwhile, then one sweep.

Workers die before they spawn, while runners start up, while runners sit in a
GIL-held native call, and while sweeps are running. Afterwards no runner may be left
and no decoy harmed. Bounded: 200 rounds, about a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exo_orphan_guard import scenarios, settings
from exo_orphan_guard.identity import ProcessIdentity, identity_of
from exo_orphan_guard.scenario_worker import RunnerKind, Watch, WorkerSpec
from tests.helpers.processes import kill_all, make_fake_exo_environment, start_orphan

ROUNDS = 200
PARALLEL = 8
TAG_VARIABLE = "EOG_CHAOS"
KINDS: list[RunnerKind] = ["idle", "gil", "child", "late", "deaf"]
CHAOS_STRATEGIES: tuple[settings.Strategy, ...] = (
    "auto",
    "pidfd",
    "sentinel",
    "poll",
    "pdeathsig",
    "watchdog",
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/*/environ")


def tagged(tag: str) -> list[ProcessIdentity]:
    """Every live process carrying `tag` in its environment: all the chaos spawned."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    found: list[ProcessIdentity] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as file:
                if needle not in file.read().split(b"\0"):
                    continue
        except OSError:
            continue
        identity = identity_of(int(name))
        if identity is not None:
            found.append(identity)
    return found


def _is_runner(process: ProcessIdentity) -> bool:
    try:
        with open(f"/proc/{process.pid}/cmdline", "rb") as file:
            return b"--multiprocessing-fork" in file.read().split(b"\0")
    except OSError:
        return False


def cli_sweep(environment: dict[str, str]) -> int:
    return subprocess.run(
        [sys.executable, "-m", "exo_orphan_guard", "sweep", "--grace", "0.3", "--json"],
        env=environment,
        capture_output=True,
        timeout=60,
        check=False,
    ).returncode


def test_chaos(tmp_path: Path, isolated_environment: Path) -> None:
    python = make_fake_exo_environment(tmp_path / "exo-env")
    tag = uuid.uuid4().hex
    rng = random.Random(int(os.environ.get("EOG_CHAOS_SEED", "0")) or None)
    environment = scenarios.scenario_environment("guard", "auto", isolated_environment)

    # Decoys, detached from this process so that no sweep spares them as its own.
    decoy_worker = scenarios.start_worker(
        ["idle", "gil", "child"], python=python, registry=isolated_environment
    )
    ordinary = start_orphan(["/bin/sleep", "900"])
    decoys = [*decoy_worker.all_processes(), ordinary]

    moments: Counter[str] = Counter()
    runners_armed = [0]
    sweeps: Counter[int] = Counter()
    stop = threading.Event()

    def sweep_meanwhile() -> None:
        while not stop.is_set():
            sweeps[cli_sweep(environment)] += 1

    def one_round(number: int) -> None:
        kinds: list[RunnerKind] = rng.sample(KINDS, k=rng.randint(1, 3))
        watch: Watch = "none" if rng.random() < 0.3 else "guard"
        strategy = rng.choice(CHAOS_STRATEGIES)
        spec = WorkerSpec(
            runners=kinds, watch=watch, spawn_from="main", go_file=str(tmp_path / f"go-{number}")
        )
        env = scenarios.scenario_environment(watch, strategy, isolated_environment)
        env[TAG_VARIABLE] = tag
        moment = rng.choice(["before spawn", "start-up", "armed"])
        env["EOG_CHAOS_ROUND"] = f"{number}:{watch}:{strategy}:{','.join(kinds)}:{moment}"
        worker = subprocess.Popen(
            [python, "-m", "exo_orphan_guard.scenario_worker", json.dumps(spec)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert worker.stdout is not None
        if moment == "before spawn":
            time.sleep(rng.uniform(0.0, 0.05))
        elif moment == "start-up":
            time.sleep(rng.uniform(0.05, 0.8))
        else:
            # Runners armed (those of kind gil/deaf inside their GIL-held call).
            ready, _, _ = select.select([worker.stdout], [], [], 30.0)
            if ready and worker.stdout.readline():
                runners_armed[0] += len(kinds)
            time.sleep(rng.uniform(scenarios.GIL_SETTLE_SECONDS, 0.6))
        moments[moment] += 1
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        worker.stdout.close()

    sweeper = threading.Thread(target=sweep_meanwhile)
    started = time.monotonic()
    sweeper.start()
    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(one_round, range(ROUNDS)))
        stop.set()
        sweeper.join()
        time.sleep(1.0)
        left_before = tagged(tag)
        final = cli_sweep(environment)
        runners_left = [process for process in tagged(tag) if _is_runner(process)]
        # What remains (multiprocessing resource trackers) leaves by itself once no
        # runner holds its pipe: never a survivor, but given a moment.
        others_left = [
            process
            for process, seen in scenarios.wait_gone(tagged(tag), 3.0).items()
            if seen is None
        ]
        elapsed = time.monotonic() - started
        harmed = [decoy for decoy in decoys if decoy not in scenarios.alive(decoys)]
        print(
            f"\nchaos: {ROUNDS} rounds in {elapsed:.0f} s; kill moments {dict(moments)}; "
            f"{runners_armed[0]} runners armed when their worker died; "
            f"{sum(sweeps.values())} sweeps meanwhile (exit codes {dict(sweeps)}); "
            f"{len(left_before)} tagged processes before the final sweep "
            f"({sum(map(_is_runner, left_before))} runners), {len(runners_left)} runners after "
            f"(exit code {final}), {len(others_left)} other processes after 3 s; "
            f"{len(harmed)} decoys harmed"
        )
        assert sweeps[2] == 0, "a sweep failed with a usage or configuration error"
        assert runners_left == [] and final == 0
        assert others_left == [], [_describe(process) for process in others_left]
        assert harmed == []
        assert runners_armed[0] > ROUNDS // 4
        assert elapsed < 120
    finally:
        stop.set()
        kill_all(tagged(tag))
        scenarios.cleanup(decoy_worker)
        kill_all([ordinary])


def _describe(process: ProcessIdentity) -> str:
    try:
        with open(f"/proc/{process.pid}/cmdline", "rb") as file:
            command = file.read().replace(b"\0", b" ").decode()
        with open(f"/proc/{process.pid}/stat") as file:
            stat = file.read().split(")")[1].split()[:2]
        with open(f"/proc/{process.pid}/environ", "rb") as file:
            environ = [item for item in file.read().split(b"\0") if b"EOG_CHAOS_ROUND" in item]
    except OSError:
        return f"{process.pid}: gone"
    return f"{process.pid} state={stat[0]} ppid={stat[1]}: {command} {environ}"
