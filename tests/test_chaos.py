"""Chaos: workers SIGKILLed at random moments, sweeps running meanwhile, then one sweep.

Workers die before they spawn, while runners start up, while runners sit in a
GIL-held native call (one that returns, or not), after their runners' watchdogs were
SIGKILLed (their understudies take over), and while sweeps are running: two
at once, each matching the other's command line, and now and then a third SIGKILLed
midway (mid-freeze, at times). Afterwards no runner may be left, no decoy harmed,
nothing left stopped. Bounded: 200 rounds, about a minute on 2 cores
(`EOG_CHAOS_ROUNDS` sets another number: `make test` runs 100, `make test-full` 200;
docs/testing.md says what they cost).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
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

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import Registry, RunnerRecord, host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.rig.scenario_worker import Watch, WorkerReport, WorkerSpec
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.system.process_facts import Pid
from exo_orphan_guard.watch.tree_kill import signal_verified
from tests.helpers.cli import CLI, run_cli
from tests.helpers.processes import carrying, kill_all, make_fake_exo_environment, start_orphan

ROUNDS = int(os.environ.get("EOG_CHAOS_ROUNDS") or 200)
HANG_SECONDS = 120.0 * max(1.0, ROUNDS / 200)
"""Past this, something hung: 200 rounds take about a minute on 2 cores; more rounds
(`EOG_CHAOS_ROUNDS=2000`, to hunt a rare race) take longer in proportion."""
DECOY_SECONDS = str(round(max(900.0, 4 * HANG_SECONDS)))
"""How long the `sleep` decoys sleep: past any run, so that one found gone was harmed
(a 2,000-round run took 1,449 s, and its 900 s decoys were found "harmed")."""
PARALLEL = 8
TAG_VARIABLE = "EOG_CHAOS"
KINDS: list[RunnerKind] = [
    "idle",
    "gil",
    "child",
    "late",
    "deaf",
    "catch",
    "hang",
    "gilbusy",
    "swallow",
    "strays",
]
"""Clean endings (idle, child, catch, strays: two children outside its group), busy
ones that return (gilbusy: native code holding the GIL for 1.5 s, every signal
blocked), one that swallows the first WorkerGone (swallow), wedged ones (gil, deaf:
killed at the busy wait), hanging ones (hang)."""
GRACE = "1.5"
BUSY_WAIT = "2.0"
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
    return carrying(TAG_VARIABLE, tag)


def _is_runner(process: ProcessIdentity) -> bool:
    try:
        with open(f"/proc/{process.pid}/cmdline", "rb") as file:
            return b"--multiprocessing-fork" in file.read().split(b"\0")
    except OSError:
        return False


def cli_sweep(environment: dict[str, str], *extra: str, targeted: set[int] | None = None) -> int:
    """Exit code of one CLI sweep; what it targeted is added to `targeted`."""
    completed = run_cli("sweep", "--grace", "0.3", "--json", *extra, env=environment)
    if targeted is not None and completed.returncode in (0, 1):
        targeted.update(suspect["pid"] for suspect in json.loads(completed.stdout)["suspects"])
    return completed.returncode


def sweep_killed_midway(environment: dict[str, str], delay: float) -> None:
    """A sweep SIGKILLed at a random moment: mid-freeze, sometimes."""
    sweeper = subprocess.Popen(
        [*CLI, "sweep", "--grace", "0.3", "--json"],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(delay)
    sweeper.kill()
    sweeper.wait()


def kill_watchdogs(report: WorkerReport) -> None:
    """SIGKILL each runner's watchdog (its child that it did not start itself), as
    the OOM killer or a user might: its understudy must take over."""
    for runner in report["runners"]:
        for pid in system.descendants(runner["pid"]):
            watchdog = identity_of(pid)
            if (
                watchdog is not None
                and pid not in runner["children"]
                and system.parent_pid(pid) == runner["pid"]
            ):
                signal_verified(watchdog, signal.SIGKILL)


def stopped(processes: list[ProcessIdentity]) -> list[ProcessIdentity]:
    found: list[ProcessIdentity] = []
    for process in processes:
        with contextlib.suppress(OSError), open(f"/proc/{process.pid}/stat", "rb") as file:
            if file.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t"):
                found.append(process)
    return found


def reused_group_decoy(registry: Path) -> ProcessIdentity:
    """A member of a group whose leader exited, and a stale record of a dead runner
    that once had the leader's pid: the group id means nothing any more."""
    leader = (
        "import os, subprocess, sys; os.setpgid(0, 0); "
        f"p = subprocess.Popen(['/bin/sleep', '{DECOY_SECONDS}'], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL); print(os.getpid(), p.pid, flush=True); os._exit(0)"
    )
    output = subprocess.run(
        [sys.executable, "-c", leader], capture_output=True, text=True, check=True
    ).stdout.split()
    group, member = int(output[0]), identity_of(int(output[1]))
    assert member is not None
    opened, _ = Registry.open(registry, create=True)
    assert opened is not None
    opened.write(
        RunnerRecord(
            pid=Pid(group),
            started=member.started - 30.0,
            boot_id=system.boot_id(),
            uid=os.geteuid(),
            worker=ProcessIdentity(Pid(os.getpid()), 1.0),
            exe=None,
            argv=("python", "--multiprocessing-fork"),
            pgid=group,
            recorded_at=time.time(),
        )
    )
    return member


@pytest.mark.machine_wide
def test_chaos(tmp_path: Path, isolated_environment: Path) -> None:
    python = make_fake_exo_environment(tmp_path / "exo-env")
    tag = uuid.uuid4().hex
    rng = random.Random(int(os.environ.get("EOG_CHAOS_SEED", "0")) or None)
    environment = scenarios.scenario_environment("guard", "auto", isolated_environment)

    # Decoys, detached from this process so that no sweep spares them as its own: a
    # guarded worker, an unguarded one started as a plain `python` from its venv's
    # PATH (nothing about it says exo), an ordinary orphan, a reused group's member.
    decoy_worker = scenarios.start_worker(
        ["idle", "gil", "child"], python=python, registry=isolated_environment
    )
    plain_worker = scenarios.start_worker(
        ["idle", "child"],
        watch="none",
        python="python",
        extra_env={"PATH": f"{Path(python).parent}:{os.environ['PATH']}"},
    )
    ordinary = start_orphan(["/bin/sleep", DECOY_SECONDS])
    regrouped = reused_group_decoy(isolated_environment)
    decoys = [*decoy_worker.all_processes(), *plain_worker.all_processes(), ordinary, regrouped]

    moments: Counter[str] = Counter()
    runners_armed = [0]
    sweeps: Counter[int] = Counter()
    killed_sweeps = [0]
    targeted: set[int] = set()
    stop = threading.Event()
    # Two sweepers at once, each matching the other's command line.
    twin = ("--match", f"eog-chaos-sweeper-{tag}", "--any-parent")

    def sweep_meanwhile() -> None:
        while not stop.is_set():
            sweeps[cli_sweep(environment, *twin, targeted=targeted)] += 1

    def one_round(number: int) -> None:
        kinds: list[RunnerKind] = rng.sample(KINDS, k=rng.randint(1, 3))
        watch: Watch = "none" if rng.random() < 0.3 else "guard"
        strategy = rng.choice(CHAOS_STRATEGIES)
        if strategy == "pdeathsig":
            # PR_SET_PDEATHSIG alone kills the runner before anything walks its tree:
            # what it started outside its group is out of reach (docs/reference.md,
            # "Limits, in full").
            kinds = [kind for kind in kinds if kind != "strays"] or ["idle"]
        spec = WorkerSpec(
            runners=kinds,
            watch=watch,
            spawn_from="main",
            go_file=str(tmp_path / f"go-{number}"),
            notes="",
        )
        env = scenarios.scenario_environment(watch, strategy, isolated_environment)
        env[TAG_VARIABLE] = tag
        env[settings.GRACE_ENV] = GRACE
        env[settings.BUSY_WAIT_ENV] = BUSY_WAIT
        moment = rng.choice(["before spawn", "start-up", "armed"])
        env["EOG_CHAOS_ROUND"] = f"{number}:{watch}:{strategy}:{','.join(kinds)}:{moment}"
        worker = subprocess.Popen(
            [python, "-m", "exo_orphan_guard.rig.scenario_worker", json.dumps(spec)],
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
            report = worker.stdout.readline() if ready else b""
            if report:
                runners_armed[0] += len(kinds)
            time.sleep(rng.uniform(scenarios.GIL_SETTLE_SECONDS, 0.6))
            if report and watch == "guard" and rng.random() < 0.5:
                moment = "armed, watchdogs killed first"
                kill_watchdogs(json.loads(report))
        moments[moment] += 1
        if rng.random() < 0.1:
            killed_sweeps[0] += 1
            sweep_killed_midway(environment, rng.uniform(0.0, 0.4))
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        worker.stdout.close()

    sweepers = [threading.Thread(target=sweep_meanwhile) for _ in range(2)]
    started = time.monotonic()
    for sweeper in sweepers:
        sweeper.start()
    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(one_round, range(ROUNDS)))
        stop.set()
        for sweeper in sweepers:
            sweeper.join()
        time.sleep(1.0)
        left_before = tagged(tag)
        final = cli_sweep(environment, targeted=targeted)
        runners_left = [process for process in tagged(tag) if _is_runner(process)]
        # What remains (multiprocessing resource trackers) leaves by itself once no
        # runner holds its pipe: never a survivor, but given a moment.
        others_left = [
            process
            for process, seen in scenarios.wait_gone(tagged(tag), 3.0).items()
            if seen is None
        ]
        elapsed = time.monotonic() - started
        ended = Counter(
            f"{ending.how}: {re.sub(r'[0-9.]+', 'N', ending.why.split(':')[0])}"
            for ending in endings.latest(
                endings.read(
                    host_directory(isolated_environment) / endings.ENDINGS_NAME, system.boot_id()
                )
            ).values()
            if ending.event == "ended"
        )
        harmed = [decoy for decoy in decoys if decoy not in scenarios.alive(decoys)]
        left_stopped = stopped([*tagged(tag), *decoys])
        print(
            f"\nchaos: {ROUNDS} rounds in {elapsed:.0f} s; kill moments {dict(moments)}; "
            f"{runners_armed[0]} runners armed when their worker died; "
            f"{sum(sweeps.values())} sweeps meanwhile (exit codes {dict(sweeps)}); "
            f"{len(left_before)} tagged processes before the final sweep "
            f"({sum(map(_is_runner, left_before))} runners), {len(runners_left)} runners after "
            f"(exit code {final}), {len(others_left)} other processes after 3 s; "
            f"{len(harmed)} decoys harmed, {len(left_stopped)} left stopped; "
            f"{killed_sweeps[0]} sweeps SIGKILLed midway; endings {dict(ended)}"
        )
        assert sweeps[2] == 0, "a sweep failed with a usage or configuration error"
        assert all(code >= 0 for code in sweeps), f"a sweep was killed by another: {sweeps}"
        assert left_stopped == []
        assert runners_left == [] and final == 0
        assert others_left == [], [_describe(process) for process in others_left]
        # A decoy that no sweep of ours targeted was harmed by something else on this
        # machine (another test run's sweep): say so rather than blame this one.
        assert [decoy for decoy in harmed if decoy.pid in targeted] == [], harmed
        assert harmed == [], f"harmed, but by none of this test's sweeps: {harmed}"
        assert runners_armed[0] > ROUNDS // 4
        assert elapsed < HANG_SECONDS
    finally:
        stop.set()
        kill_all(tagged(tag))
        scenarios.cleanup(decoy_worker)
        scenarios.cleanup(plain_worker)
        kill_all([ordinary, regrouped])


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
