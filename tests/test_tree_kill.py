"""The kill path on real processes: the group, then strays that left it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.scenario_worker import SLOW_FORK_SECONDS_ENV
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.watch.tree_kill import kill_runner_tree
from tests.conftest import StartWorker
from tests.helpers.processes import kill_all

# A runner that leads its own group, with a child in the group and a stray that left
# it (its own session, as a daemonising helper would). Prints the two pids.
RUNNER = """
import subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
member = subprocess.Popen(sleep)
stray = subprocess.Popen(sleep, start_new_session=True)
print(member.pid, stray.pid, flush=True)
time.sleep(120)
"""


@pytest.fixture
def runner_tree() -> Iterator[tuple[ProcessIdentity, ProcessIdentity, ProcessIdentity]]:
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert runner.stdout is not None
    member_pid, stray_pid = (int(word) for word in runner.stdout.readline().split())
    identities = [identity_of(pid) for pid in (runner.pid, member_pid, stray_pid)]
    assert all(identity is not None for identity in identities)
    tree = tuple(identity for identity in identities if identity is not None)
    assert os.getpgid(stray_pid) != runner.pid == os.getpgid(member_pid)
    yield tree[0], tree[1], tree[2]
    for identity in tree:
        if scenarios.alive([identity]):
            os.kill(identity.pid, 9)
    runner.kill()
    runner.wait()
    scenarios.wait_gone(list(tree), 5.0)


def test_group_then_strays_from_outside_the_group(
    runner_tree: tuple[ProcessIdentity, ProcessIdentity, ProcessIdentity],
) -> None:
    runner, member, stray = runner_tree
    kill_runner_tree(runner, runner.pid)
    exits = scenarios.wait_gone([runner, member, stray], 2.0)
    assert all(seen is not None for seen in exits.values()), exits


def test_without_a_group_the_walk_takes_the_whole_tree(
    runner_tree: tuple[ProcessIdentity, ProcessIdentity, ProcessIdentity],
) -> None:
    runner, member, stray = runner_tree
    kill_runner_tree(runner, None)
    exits = scenarios.wait_gone([runner, member, stray], 2.0)
    assert all(seen is not None for seen in exits.values()), exits


def test_the_walk_sees_the_whole_tree_at_once(
    runner_tree: tuple[ProcessIdentity, ProcessIdentity, ProcessIdentity],
) -> None:
    runner, member, stray = runner_tree
    found = system.descendants(runner.pid)
    assert set(found) == {member.pid, stray.pid}, (system.BACKEND, found)


def test_a_runner_stopped_while_its_worker_lives_takes_what_it_started(
    start_worker: StartWorker,
) -> None:
    """exo's own stop (SIGTERM, then SIGKILL), or Ctrl-C's SIGINT, which reaches the
    worker's group only: the runner's children must not outlive it."""
    worker = start_worker(["child", "idle"])
    victim, sibling = worker.runners
    os.kill(victim.identity.pid, signal.SIGTERM)
    exits = scenarios.wait_gone(list(victim.tree), 10.0)
    assert all(seen is not None for seen in exits.values()), exits
    assert worker.process.poll() is None
    assert scenarios.alive(list(sibling.tree)) == list(sibling.tree)


def test_a_runner_stopped_before_its_watchdog_first_ran_takes_what_it_started(
    start_worker: StartWorker,
) -> None:
    """The watchdog first runs half a second after its fork (as under coverage's fork
    hook or a loaded machine), and exo stops the runner meanwhile: the watchdog must
    still end the runner's child. It used to exit at once when its parent was not the
    runner any more, and the child lived on."""
    worker = start_worker(["child"], extra_env={SLOW_FORK_SECONDS_ENV: "0.5"})
    (victim,) = worker.runners
    os.kill(victim.identity.pid, signal.SIGTERM)
    exits = scenarios.wait_gone(list(victim.tree), 10.0)
    assert all(seen is not None for seen in exits.values()), exits
    assert worker.process.poll() is None


STRAY_HOOK = Path(__file__).parent / "helpers" / "stray_after_walk"


@pytest.mark.parametrize("strategy", ["sentinel", "poll"])
def test_a_child_started_while_the_tree_is_walked_goes_with_the_runner(
    start_worker: StartWorker, tmp_path: Path, strategy: settings.Strategy
) -> None:
    """Killed at once by its own watch thread (a waiter alone: no watchdog races it),
    the runner runs on while the walk of its tree goes: its main thread may start a
    child that leaves the group. The hook starts one right after the walk. Found by
    the chaos test (`guard:pidfd:strays,idle`: two `sleep` left, ppid 1)."""
    pid_file = tmp_path / "stray"
    path = os.environ.get("PYTHONPATH", "")
    worker = start_worker(
        ["idle"],
        strategy=strategy,
        extra_env={
            "EOG_TEST_STRAY_AFTER_WALK": str(pid_file),
            "PYTHONPATH": os.pathsep.join(part for part in (str(STRAY_HOOK), path) if part),
        },
    )
    (runner,) = worker.runners
    os.kill(worker.pid, signal.SIGKILL)
    worker.process.wait()
    assert scenarios.wait_gone([runner.identity], 10.0)[runner.identity] is not None
    assert pid_file.exists(), "the hook never ran: the test proves nothing"
    stray = identity_of(int(pid_file.read_text()))
    try:
        assert stray is None or scenarios.wait_gone([stray], 2.0)[stray] is not None
    finally:
        if stray is not None:
            kill_all([stray])
