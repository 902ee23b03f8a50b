"""Every kill is verified: a walk of the process table is older than its answer, and a
pid it names may belong to a stranger by the time it is signalled (the old pid reused,
or a listing taken before the tree changed). Here the walk is made stale on purpose:
it names an innocent process of this test's own, which must survive both the watch's
tree kill and the exec wrapper's."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.system.process_facts import Pid
from exo_orphan_guard.watch.clean_ending import NOTICE_SIGNAL
from exo_orphan_guard.watch.tree_kill import kill_runner_tree, signal_verified
from tests.helpers.waiting import wait_until

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
# The exec wrapper, with its walks of the tree and of its group made stale: each also
# names the innocent process whose pid is the script's first argument.
STALE_WRAPPER = """
import sys
from exo_orphan_guard import system
from exo_orphan_guard.watch import exec_wrapper
innocent = int(sys.argv[1])
walk, listing = system.descendants, system.group_members
system.descendants = lambda pid: [*walk(pid), innocent]
system.group_members = lambda groups: [*listing(groups), innocent]
sys.exit(exec_wrapper.run(exec_wrapper.ExecOptions(tuple(sys.argv[2:]), grace=0.3)))
"""
# The exec wrapper, its walk of the command's tree made stale by real pid reuse: after
# the walk, the command's child is killed and its pid given to an innocent process (in
# a session of its own, not the wrapper's child) through ns_last_pid (PLANT). Writes
# the two pids to the file named by its first argument.
REUSING_WRAPPER = """
import os, subprocess, sys, time
from exo_orphan_guard import system
from exo_orphan_guard.watch import exec_wrapper
report, plant = sys.argv[1], sys.argv[2]
walk = system.descendants
def reused(pid):
    found = walk(pid)
    system.descendants = walk
    member = found[0]
    os.kill(member, 9)
    while os.path.exists(f"/proc/{member}"):
        time.sleep(0.001)
    planted = subprocess.run([sys.executable, "-c", plant, str(member)], capture_output=True)
    with open(report, "w") as file:
        file.write(f"{member} {planted.stdout.decode().strip()}")
    return found
system.descendants = reused
sys.exit(exec_wrapper.run(exec_wrapper.ExecOptions(tuple(sys.argv[3:]), grace=0.3)))
"""
PLANT = """
import subprocess, sys
with open("/proc/sys/kernel/ns_last_pid", "w") as file:
    file.write(str(int(sys.argv[1]) - 1))
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
print(subprocess.Popen(["sleep", "120"], start_new_session=True, **quiet).pid, flush=True)
"""
# Ignores SIGTERM and has its child reaped at once, so that the child's pid is freed.
DEAF_WITH_CHILD = (
    "import signal, subprocess, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "subprocess.Popen(['sleep', '120'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)
# Ignores SIGTERM, so that the wrapper's grace runs out and it kills the tree.
DEAF = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def _sleeper() -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """A process of this test's own, in its own session."""
    process = subprocess.Popen(SLEEP, start_new_session=True)
    identity = identity_of(process.pid)
    assert identity is not None
    return process, identity


@pytest.fixture
def innocent() -> Iterator[ProcessIdentity]:
    """In no tree or group that a test kills."""
    process, identity = _sleeper()
    yield identity
    process.kill()
    process.wait()


def _stale(real: Callable[..., list[Pid]], extra: ProcessIdentity) -> Callable[..., list[Pid]]:
    def walk(*arguments: int | Collection[int]) -> list[Pid]:
        return [*real(*arguments), extra.pid]

    return walk


def test_the_watchs_tree_kill_spares_a_pid_its_walk_names_wrongly(
    innocent: ProcessIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, runner_identity = _sleeper()
    try:
        monkeypatch.setattr(system, "descendants", _stale(system.descendants, innocent))
        kill_runner_tree(runner_identity, runner.pid)
        assert runner.wait(timeout=10) == -signal.SIGKILL
        assert scenarios.alive([innocent]), "a pid from a stale walk was signalled"
    finally:
        runner.kill()
        runner.wait()


def test_the_exec_wrapper_kills_only_what_it_verified(
    innocent: ProcessIdentity, isolated_environment: object
) -> None:
    del isolated_environment
    wrapper = subprocess.Popen(
        [sys.executable, "-c", STALE_WRAPPER, str(innocent.pid), sys.executable, "-c", DEAF],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wrapper.stdout is not None
        assert wrapper.stdout.readline() == "ready\n"
        deaf = system.child_pids(wrapper.pid)
        assert deaf, "the wrapper's command should be running"
        # SIGTERM is forwarded, ignored; after the grace the wrapper kills its tree,
        # whose walks (of the command's descendants, of its group) name the innocent.
        os.kill(wrapper.pid, signal.SIGTERM)
        assert wrapper.wait(timeout=30) == 128 + signal.SIGKILL
        assert scenarios.alive([innocent]), "the wrapper signalled a pid it never verified"
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def _may_choose_pids() -> bool:
    return sys.platform == "linux" and os.access("/proc/sys/kernel/ns_last_pid", os.W_OK)


@pytest.mark.skipif(
    not _may_choose_pids(), reason="choosing the next pid needs root in its own pid namespace"
)
def test_the_exec_wrapper_spares_a_process_that_took_a_walked_pid(
    isolated_environment: Path, tmp_path: Path
) -> None:
    del isolated_environment
    report = tmp_path / "reused"
    command = [sys.executable, "-c", DEAF_WITH_CHILD]
    wrapper = subprocess.Popen(
        [sys.executable, "-c", REUSING_WRAPPER, str(report), PLANT, *command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    innocent: ProcessIdentity | None = None
    try:
        assert wrapper.stdout is not None
        assert wrapper.stdout.readline() == "ready\n"
        # SIGTERM is forwarded, ignored; after the grace the wrapper walks the tree,
        # and the walked child's pid is reused before anything is signalled.
        os.kill(wrapper.pid, signal.SIGTERM)
        assert wrapper.wait(timeout=30) == 128 + signal.SIGKILL
        member, planted = (int(word) for word in report.read_text().split())
        innocent = identity_of(planted)
        if planted != member:
            pytest.skip(f"another process took pid {member} first (the innocent got {planted})")
        # Planted in a session of its own, and no one's child it could be killed as.
        assert innocent is not None, "the wrapper signalled a pid reused since its walk"
        assert scenarios.alive([innocent])
        # The wrapper's keeper is a fork made after the walk was patched: its own walk
        # fails, and it must still end the wrapper's group, itself included.
        assert wait_until(lambda: not system.group_members([wrapper.pid]), 5.0), (
            "the wrapper's group outlived it"
        )
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        if innocent is None and report.exists():
            innocent = identity_of(int(report.read_text().split()[1]))
        if innocent is not None and scenarios.alive([innocent]):
            os.kill(innocent.pid, signal.SIGKILL)


def test_the_watchdogs_notice_reaches_its_runner_and_never_a_stranger_with_its_pid() -> None:
    """The watchdog tells its runner by `signal_verified`: a runner that died before
    the notice may have left its pid to a stranger, for whom SIGUSR1 is the end (the
    default action). The stranger stands in as the same pid read with another start
    stamp; its twin, named rightly, proves the notice goes out at all."""
    stranger, runner = subprocess.Popen(SLEEP), subprocess.Popen(SLEEP)
    try:
        named = [identity_of(Pid(process.pid)) for process in (stranger, runner)]
        assert named[0] is not None and named[1] is not None
        earlier = dataclasses.replace(named[0], started=named[0].started - 1.0)
        signal_verified(earlier, NOTICE_SIGNAL)
        signal_verified(named[1], NOTICE_SIGNAL)
        assert runner.wait(timeout=10.0) == -NOTICE_SIGNAL
        assert stranger.poll() is None, "the notice reached a stranger"
    finally:
        for process in (stranger, runner):
            process.kill()
            process.wait()
