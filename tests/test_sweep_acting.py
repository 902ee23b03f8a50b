"""How a sweep acts, on real processes: what it freezes it always continues, what it
would signal it lists, and a runner that dies while it acts leaves nothing behind."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records.registry import Registry, host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import signalling
from exo_orphan_guard.system._linux import read_stat
from exo_orphan_guard.system.identity import ProcessIdentity, liveness
from exo_orphan_guard.tools import cli
from tests.conftest import StartWorker
from tests.helpers.cli import report_of, run_cli
from tests.helpers.processes import start_deaf_orphan, start_orphan

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="plants processes via /proc")


RUNNING = ("S", "R", "D")
"""Not stopped: a python just started may be in D, reading its modules."""


def state_of(identity: ProcessIdentity) -> str | None:
    """Its state once pending signals had time to land (a stop is not instant)."""
    time.sleep(0.2)
    stat = read_stat(identity.pid)
    return None if stat is None or liveness(identity) != "alive" else stat.state


# --- a sweep killed mid-freeze ----------------------------------------------------------

_DIE_AFTER_FIRST_STOP = """
import os, signal, sys
from exo_orphan_guard.system import signalling
from exo_orphan_guard.sweeper.sweeping import sweep

real = signalling.send

def send(target, number):
    delivery = real(target, number)
    if number == signal.SIGSTOP:
        os.kill(os.getpid(), signal.SIGKILL)  # the sweeper dies with its target frozen
    return delivery

signalling.send = send
sweep(match=sys.argv[1], any_parent=True, fingerprint=False, grace=0.2)
"""


def test_what_a_dead_sweeper_froze_is_continued_by_the_next_sweep(
    planted: list[ProcessIdentity], isolated_environment: Path, tmp_path: Path
) -> None:
    # It outlives SIGTERM: a sweep freezes a tree only before SIGKILL.
    token = f"eog-frozen-{uuid.uuid4().hex}"
    target = start_deaf_orphan(token, tmp_path)
    planted.append(target)
    dying = subprocess.run(
        [sys.executable, "-c", _DIE_AFTER_FIRST_STOP, token], check=False, capture_output=True
    )
    assert dying.returncode == -signal.SIGKILL, dying.stderr
    assert state_of(target) == "T", "the sweeper should have died with the target stopped"
    # The next sweep is not after this process at all (no --match), yet continues it.
    report = sweep(grace=0.2, fingerprint=False)
    assert [identity.pid for identity in report.continued] == [target.pid]
    assert state_of(target) in RUNNING
    assert not any(host_directory(isolated_environment).glob("frozen-*"))


def test_an_interrupted_sweep_leaves_nothing_stopped(
    planted: list[ProcessIdentity], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token = f"eog-ctrl-c-{uuid.uuid4().hex}"
    target = start_deaf_orphan(token, tmp_path)
    planted.append(target)
    real = signalling.send

    def interrupt_after_stop(target: ProcessIdentity, number: int) -> signalling.Delivery:
        delivery = real(target, number)
        if number == signal.SIGSTOP:
            raise KeyboardInterrupt
        return delivery

    monkeypatch.setattr(signalling, "send", interrupt_after_stop)
    with pytest.raises(KeyboardInterrupt):
        sweep(match=token, any_parent=True, fingerprint=False, grace=0.2)
    assert state_of(target) in RUNNING


# --- scan shows everything a sweep would signal ---------------------------------------


def test_scan_lists_the_descendants_a_sweep_would_signal(
    planted: list[ProcessIdentity],
) -> None:
    token = f"eog-tree-{uuid.uuid4().hex}"
    code = "import subprocess, time; subprocess.Popen(['/bin/sleep', '600']); time.sleep(600)"
    parent = start_orphan([sys.executable, "-c", f"{code}  # {token}"])
    planted.append(parent)
    deadline = time.monotonic() + 10
    while not (children := psutil.Process(parent.pid).children()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    child = children[0].pid
    report = report_of(run_cli("scan", "--json", "--registry-only", "--match", token))
    (suspect,) = report["suspects"]
    assert suspect["pid"] == parent.pid and suspect["descendants"] == [child]
    table = run_cli("scan", "--registry-only", "--match", token).stdout
    assert f"descendant(s) {child}" in table
    swept = report_of(run_cli("sweep", "--json", "--registry-only", "--match", token))
    assert swept["results"][0]["descendants"] == [child]


# --- a filesystem without locks ----------------------------------------------------------


def test_a_filesystem_without_locks_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    code = cli.main(["sweep", "--json", "--registry-only"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert any("cannot lock" in warning for warning in document["warnings"])


# --- the runner that dies while the sweep acts ---------------------------------------------


_RUNNER_DIES_FIRST = """
import json, os, signal, sys, time
from exo_orphan_guard import system
from exo_orphan_guard.sweeper import engine
from exo_orphan_guard.system.identity import identity_of
from exo_orphan_guard.sweeper.sweeping import sweep

runner, child = identity_of(int(sys.argv[1])), int(sys.argv[2])
real_end = engine.end

def runner_dies_first(targets, *rest, **named):
    if any(target.identity == runner for target in targets):
        os.kill(runner.pid, signal.SIGKILL)
        while system.parent_pid(child) == runner.pid:  # until it is reparented
            time.sleep(0.001)
    return real_end(targets, *rest, **named)

engine.end = runner_dies_first
report = sweep(grace=0.2, fingerprint=False)
print(json.dumps([verdict.rule for verdict in report.targets]))
"""


@pytest.mark.skipif(
    system.BACKEND != "linux",
    reason="proof of descent is the inherited environment, which the portable backend "
    "(macOS) cannot read: there the child is spared, and the watchdog is what kills it",
)
def test_a_runner_dying_between_snapshot_and_kill_leaves_no_child(
    start_worker: StartWorker, isolated_environment: Path
) -> None:
    """The chaos test's find: a recorded runner is judged an orphan, then dies (its
    PR_SET_PDEATHSIG, say) before it is frozen; its child, reparented out of reach of
    the tree walk, still sits in the runner's group."""
    worker = start_worker(["child"], strategy="sentinel")
    (runner,) = worker.runners
    (child,) = runner.children
    # Its record now names a worker that is gone.
    path = host_directory(isolated_environment) / f"runner-{runner.identity.pid}.json"
    registry, _ = Registry.open(isolated_environment, create=False)
    assert registry is not None
    (loaded,) = registry.load()[0]
    dead = ProcessIdentity(worker.pid, loaded.record.worker.started - 1.0)
    registry.write(dataclasses.replace(loaded.record, worker=dead))
    completed = subprocess.run(
        [sys.executable, "-c", _RUNNER_DIES_FIRST, str(runner.identity.pid), str(child.pid)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert scenarios.wait_gone([child], 2.0)[child] is not None, completed.stdout
    assert json.loads(completed.stdout) == ["registry", "registry-group"]
    assert not path.exists()


# --- the runner that dies while the sweep reads the process table ----------------------------


_WORKER_DIES_WHILE_READ = """
import json, os, signal, sys, time
from exo_orphan_guard.sweeper import process_table
from exo_orphan_guard.system.identity import identity_of, liveness
from exo_orphan_guard.sweeper.sweeping import sweep

worker, runner = identity_of(int(sys.argv[1])), identity_of(int(sys.argv[2]))
real_describe = process_table._describe
read: list[int] = []

def describe(pid):
    info = real_describe(pid)
    read.append(pid)
    if pid == worker.pid and runner.pid not in read:
        # Read alive; dies now, and its runner with it, before the runner is read.
        os.kill(worker.pid, signal.SIGKILL)
        while liveness(runner) == "alive":
            time.sleep(0.001)
    return info

process_table._describe = describe
report = sweep(grace=0.2, fingerprint=False)
print(json.dumps([verdict.rule for verdict in report.targets]))
"""


@pytest.mark.skipif(
    system.BACKEND != "linux",
    reason="PR_SET_PDEATHSIG, and proof of descent is the inherited environment, which the "
    "portable backend (macOS) cannot read",
)
def test_a_runner_gone_between_its_workers_read_and_its_own_keeps_its_group_judged(
    start_worker: StartWorker, isolated_environment: Path
) -> None:
    """The chaos test's second find: the snapshot reads the worker alive, the worker
    dies, PR_SET_PDEATHSIG takes the runner, the snapshot reads the runner gone. Its
    group was not read (both lived when the sweep chose which to read): the record
    must stay for a pass that reads it, or the runner's child outlives everything."""
    worker = start_worker(["child"], strategy="pdeathsig")
    (runner,) = worker.runners
    (child,) = runner.children
    path = host_directory(isolated_environment) / f"runner-{runner.identity.pid}.json"
    completed = subprocess.run(
        [sys.executable, "-c", _WORKER_DIES_WHILE_READ, str(worker.pid), str(runner.identity.pid)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert scenarios.wait_gone([child], 2.0)[child] is not None, completed.stdout
    assert json.loads(completed.stdout) == ["registry-group"]
    assert not path.exists()
