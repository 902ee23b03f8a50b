"""The parent watch on real processes: SIGKILL a worker, read the process table.

Every "gone" assertion has a twin with the guard off that asserts the orphans live,
so none of these can pass by accident.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.runner_kinds import RunnerKind
from exo_orphan_guard.system import settings
from exo_orphan_guard.watch.waiters import can_use_pidfd
from tests.conftest import StartWorker
from tests.helpers.waiting import wait_until

GONE_WITHIN_SECONDS = 10.0
"""How long a covered runner may take to go: a bound for a loaded machine, met at once
when the guard works (how soon is `make bench`'s watch section). An uncovered one is
read when the covered ones are gone."""
linux_backend_only = pytest.mark.skipif(
    system.BACKEND != "linux", reason="Linux backend mechanism: the portable backend has none"
)

ALL_KINDS: list[RunnerKind] = ["idle", "gil", "child", "late"]


def kill_and_wait(
    worker: scenarios.StartedWorker,
    timeout: float,
    *,
    covered: set[RunnerKind] | None = None,
    settle: bool = True,
) -> dict[str, float | None]:
    """SIGKILL the worker; when each of its processes was seen gone after it (None:
    alive). Waits up to `timeout` for the trees of the runners of `covered` kinds
    (all, by default); the others are read once, when those are gone: a runner a
    mechanism does not reach has had as long to go as the ones it reaches took."""
    waited = [
        member
        for runner in worker.runners
        if covered is None or runner.kind in covered
        for member in runner.tree
    ]
    everyone = worker.all_processes()
    killed_at = scenarios.kill_worker(worker, settle=settle)
    exits = scenarios.wait_gone(waited or everyone, timeout)
    now = time.monotonic()
    for identity in everyone:
        if identity not in exits:
            exits[identity] = None if scenarios.alive([identity]) else now
    return {
        f"{kind}:{identity.pid}": None if seen is None else seen - killed_at
        for identity, seen in exits.items()
        for kind in [_kind_of(worker, identity)]
    }


def _kind_of(worker: scenarios.StartedWorker, identity: object) -> str:
    for runner in worker.runners:
        if identity == runner.identity:
            return runner.kind
        if identity in runner.children:
            return f"{runner.kind}-child"
        if identity in runner.helpers:
            return f"{runner.kind}-watchdog"
    return "?"


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_guard_on_every_runner_and_its_tree_is_gone_guard_off_left_alive(
    start_worker: StartWorker, kind: RunnerKind
) -> None:
    unguarded = start_worker([kind, kind], watch="none")
    guarded = start_worker([kind, kind])
    orphans = unguarded.all_processes()
    scenarios.kill_worker(unguarded)
    latencies = kill_and_wait(guarded, GONE_WITHIN_SECONDS, settle=False)
    assert all(latency is not None for latency in latencies.values()), latencies
    # The control, killed first: the same runners without the guard outlived the wait.
    assert scenarios.alive(orphans) == orphans


def test_a_bad_toggle_value_leaves_the_guard_off(start_worker: StartWorker) -> None:
    worker = start_worker(["idle"], extra_env={settings.TOGGLE_ENV: "maybe"})
    assert kill_and_wait(worker, 0.5) == {f"idle:{worker.runners[0].identity.pid}": None}


# Which mechanism covers what. `auto` arms all that are safe; the single strategies
# exist so that each mechanism is exercised alone. Thread waiters cannot act while the
# runner holds the GIL; PR_SET_PDEATHSIG kills the runner but not what it started.
MECHANISM_COVERS: dict[settings.Strategy, set[RunnerKind]] = {
    "auto": {"idle", "gil", "child", "late"},
    "watchdog": {"idle", "gil", "child", "late"},
    "pdeathsig": {"idle", "gil", "late"},
    "pidfd": {"idle", "child", "late"},
    "sentinel": {"idle", "child", "late"},
    "poll": {"idle", "child", "late"},
}


@pytest.mark.parametrize("strategy", list(MECHANISM_COVERS))
def test_each_mechanism_covers_exactly_what_the_design_says(
    start_worker: StartWorker, strategy: settings.Strategy
) -> None:
    if strategy in ("pdeathsig", "pidfd") and not (sys.platform == "linux" and can_use_pidfd()):
        pytest.skip("Linux backend mechanism: the portable backend has none")
    worker = start_worker(ALL_KINDS, strategy=strategy)
    latencies = kill_and_wait(worker, GONE_WITHIN_SECONDS, covered=MECHANISM_COVERS[strategy])
    for runner in worker.runners:
        gone = latencies[f"{runner.kind}:{runner.identity.pid}"] is not None
        tree_gone = all(
            latencies[f"{_kind_of(worker, member)}:{member.pid}"] is not None
            for member in runner.tree
        )
        covered = runner.kind in MECHANISM_COVERS[strategy]
        assert (gone and tree_gone) == covered, (strategy, runner.kind, latencies)


@pytest.mark.parametrize("watch", ["guard", "none"])
@linux_backend_only
def test_orphans_reparented_to_a_subreaper_not_pid_1(
    watch: str, isolated_environment: Path
) -> None:
    script = Path(__file__).parent / "helpers" / "subreaper_scenario.py"
    completed = subprocess.run(
        [sys.executable, str(script), watch, str(isolated_environment)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    # The orphans did land on the subreaper, so `ppid == 1` would not have found them.
    # (Guarded runners may be gone before their parent could be read.)
    assert all(parent == result["subreaper"] for parent in result["orphan_parents"]), result
    if watch == "guard":
        assert result["alive_after"] == [], result
    else:
        assert len(result["orphan_parents"]) == 3
        assert len(result["alive_after"]) == result["tracked"], result


def test_killing_one_runner_spares_its_worker_and_siblings(
    start_worker: StartWorker, isolated_environment: Path
) -> None:
    worker = start_worker(["idle", "gil", "child"])
    victim, *siblings = worker.runners
    record = host_directory(isolated_environment) / f"runner-{victim.identity.pid}.json"
    assert record.exists()
    os.kill(victim.identity.pid, signal.SIGKILL)
    exits = scenarios.wait_gone(list(victim.tree), GONE_WITHIN_SECONDS)
    # The victim's watchdog goes with it, never outliving its runner, and takes the
    # record of a runner that died while its worker lives.
    assert all(seen is not None for seen in exits.values()), exits
    assert not record.exists()
    time.sleep(0.5)
    assert worker.process.poll() is None
    survivors = [identity for sibling in siblings for identity in sibling.tree]
    assert scenarios.alive(survivors) == survivors


@pytest.mark.parametrize("strategy", ["auto", "pdeathsig", "watchdog", "pidfd", "sentinel", "poll"])
def test_runners_of_a_healthy_worker_live_after_their_spawning_thread_ends(
    start_worker: StartWorker, strategy: settings.Strategy
) -> None:
    if strategy in ("pdeathsig", "pidfd") and not (sys.platform == "linux" and can_use_pidfd()):
        pytest.skip("Linux backend mechanism: the portable backend has none")
    worker = start_worker(["idle", "gil"], strategy=strategy, spawn_from="thread")
    twin = start_worker(["idle", "gil"], strategy=strategy, spawn_from="thread")
    everyone = worker.all_processes()
    # Still guarded, though: once the worker dies they go (as far as the mechanism
    # reaches; pdeathsig, unsafe here, hands over to the watchdog).
    covers = MECHANISM_COVERS["watchdog" if strategy == "pdeathsig" else strategy]
    for started in (twin, worker):
        # The twin's end times the mechanism: a runner that took the end of its
        # spawning thread (before the twin started) for its worker's death was gone
        # by then.
        assert scenarios.alive(everyone) == everyone, strategy
        latencies = kill_and_wait(started, GONE_WITHIN_SECONDS, covered=covers)
        for runner in started.runners:
            gone = latencies[f"{runner.kind}:{runner.identity.pid}"] is not None
            assert gone == (runner.kind in covers), (strategy, latencies)


def test_healthy_runners_never_exit_on_their_own(start_worker: StartWorker) -> None:
    worker = start_worker(["idle", "gil", "child"])
    # Long enough for any mechanism to act on a wrong reading: the time another
    # worker takes to start and, once killed, to lose its runners.
    twin = start_worker(["idle", "gil", "child"])
    latencies = kill_and_wait(twin, GONE_WITHIN_SECONDS)
    assert all(latency is not None for latency in latencies.values()), latencies
    everyone = worker.all_processes()
    assert scenarios.alive(everyone) == everyone
    assert worker.process.poll() is None


def test_the_runner_leads_its_own_process_group(start_worker: StartWorker) -> None:
    worker = start_worker(["child"])
    runner = worker.runners[0]
    assert os.getpgid(runner.identity.pid) == runner.identity.pid
    assert all(os.getpgid(member.pid) == runner.identity.pid for member in runner.tree)
    assert os.getpgid(worker.pid) != runner.identity.pid


def test_the_watchdog_holds_none_of_the_runners_pipes(start_worker: StartWorker) -> None:
    worker = start_worker(["idle"], strategy="watchdog")
    watchdog = worker.runners[0].watchdog

    def held() -> tuple[set[str], list[object], set[str]]:
        # psutil (the portable backend's poll) reads /proc files for a moment on Linux.
        open_files = {
            Path(entry.path).name
            for entry in psutil.Process(watchdog.pid).open_files()
            if not entry.path.startswith("/proc/")
        }
        connections: list[object] = list(psutil.Process(watchdog.pid).net_connections("all"))
        fd_targets = {os.devnull}
        if sys.platform == "linux":
            fd_targets = {os.readlink(f"/proc/{watchdog.pid}/fd/{fd}") for fd in range(3)}
        return open_files, connections, fd_targets

    # Until the forked watchdog is first scheduled, it still holds the runner's files
    # as fork copied them: it lets them go at its start, which under load may come late.
    detached: tuple[set[str], list[object], set[str]] = (set(), [], {os.devnull})
    assert wait_until(lambda: held() == detached, 10.0), held()


def test_a_workers_cleanup_leaves_none_of_its_files(start_worker: StartWorker) -> None:
    """Its go directory goes whole, with the cue a runner held in native code leaves
    there (a run of the suite left about a hundred such directories in /tmp)."""
    worker = start_worker(["gil"], watch="none")
    scenarios.wait_in_native_code(worker)
    assert list(worker.go_file.parent.iterdir())
    scenarios.cleanup(worker)
    assert not worker.go_file.parent.exists()
    assert scenarios.alive(worker.all_processes()) == []
