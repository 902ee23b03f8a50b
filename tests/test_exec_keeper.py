"""`exec`'s one helper process, its keeper, and what the wrapper says (issue 42).

A rank under the wrapper has one helper beside its command: the keeper, which ends
the command's tree when the wrapper is SIGKILLed, and ends a wrapper still there past
its grace after its launcher died. A keeper that dies is replaced by the wrapper
itself. The wrapper speaks of its rank, its launcher and its command, never of
runners and workers, and says what it will do ("if it has not exited 10 s later").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of

from .helpers.cli import CLI
from .helpers.processes import gone_within, kill_all
from .helpers.waiting import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and uses pidfds")

GONE_WITHIN_SECONDS = 10.0
# The command: reports its pid and its child's, then waits.
WITH_CHILD = (
    "import os, subprocess, time\n"
    "child = subprocess.Popen(['sleep', '3600'])\n"
    "print(os.getpid(), child.pid, flush=True)\n"
    "time.sleep(3600)\n"
)
COMMAND = (sys.executable, "-c", WITH_CHILD)
# The launcher: starts the wrapper, reports its pid and what the command reported.
LAUNCHER = (
    "import subprocess, sys\n"
    "wrapper = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)\n"
    "print(wrapper.pid, wrapper.stdout.readline().strip(), flush=True)\n"
    "wrapper.wait()\n"
)


class Rank:
    def __init__(self, launcher: subprocess.Popen[str], stderr: Path) -> None:
        assert launcher.stdout is not None
        line = launcher.stdout.readline()
        wrapper, command, child = (identity_of(int(word)) for word in line.split())
        assert wrapper is not None and command is not None and child is not None, line
        self.launcher, self.stderr = launcher, stderr
        self.wrapper, self.command, self.child = wrapper, command, child
        # The wrapper forks its keeper, then writes its record.
        record = host_directory(settings.registry_dir()) / f"runner-{wrapper.pid}.json"
        assert wait_until(record.exists, 10.0)

    @property
    def tree(self) -> list[ProcessIdentity]:
        return [self.wrapper, self.command, self.child]

    def helpers(self) -> list[int]:
        """The wrapper's descendants outside its command's tree."""
        mine = {self.command.pid, self.child.pid}
        return [pid for pid in system.descendants(self.wrapper.pid) if pid not in mine]

    def said(self) -> list[str]:
        return self.stderr.read_text().splitlines()


StartRank = Callable[..., Rank]


@pytest.fixture
def start_rank(tmp_path: Path) -> Iterator[StartRank]:
    """Start `launcher -> exec OPTIONS -- command` (rank 3); all gone at teardown."""
    started: list[Rank] = []

    def start(*options: str) -> Rank:
        stderr = tmp_path / f"stderr-{len(started)}"
        with stderr.open("w") as sink:
            launcher = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, *CLI, "exec", *options, "--", *COMMAND],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=sink,
                text=True,
                env={**os.environ, "MLX_RANK": "3"},
            )
        started.append(Rank(launcher, stderr))
        return started[-1]

    yield start
    for rank in started:
        if rank.launcher.poll() is None:
            rank.launcher.kill()
            rank.launcher.wait()
        helpers = [identity_of(pid) for pid in rank.helpers()]
        kill_all([*rank.tree, *(helper for helper in helpers if helper is not None)])


def test_a_rank_has_one_helper_process_its_keeper(start_rank: StartRank) -> None:
    """Not a watchdog and its understudy: one process, the wrapper's child, which
    starts none."""
    rank = start_rank()
    (keeper,) = rank.helpers()
    assert system.parent_pid(keeper) == rank.wrapper.pid
    assert system.child_pids(keeper) == []


def test_a_launchers_death_is_said_in_a_ranks_words(start_rank: StartRank) -> None:
    rank = start_rank()
    rank.launcher.kill()
    rank.launcher.wait()
    assert gone_within(rank.tree, GONE_WITHIN_SECONDS)
    assert rank.said() == [
        f"exo-orphan-guard exec (rank 3): its launcher (pid {rank.launcher.pid}) is gone: "
        f"SIGTERM to the command (pid {rank.command.pid}); SIGKILL to it and its process "
        "group if it has not exited 10 s later"
    ]


def test_a_dead_keeper_is_replaced_and_the_next_one_ends_a_killed_wrappers_tree(
    start_rank: StartRank,
) -> None:
    rank = start_rank()
    (keeper,) = rank.helpers()
    os.kill(keeper, signal.SIGKILL)
    assert wait_until(lambda: len(rank.said()) == 1, 10.0), "no word of the keeper's death"
    (line,) = rank.said()
    assert line.startswith(f"exo-orphan-guard exec (rank 3): its keeper (pid {keeper}) died: ")
    (replacement,) = rank.helpers()
    assert replacement != keeper and line.endswith(f"started another (pid {replacement})")
    os.kill(rank.wrapper.pid, signal.SIGKILL)
    # The command's own child too: only a group kill reaches it (PR_SET_PDEATHSIG
    # takes the command alone).
    assert gone_within([rank.command, rank.child], GONE_WITHIN_SECONDS)


def test_a_stopped_wrapper_is_ended_by_its_keeper_after_its_grace(
    start_rank: StartRank, isolated_environment: Path
) -> None:
    rank = start_rank("--grace", "0.5")
    # A member whose parent (this test) is outside the group keeps the group from being
    # orphaned, so the kernel does not SIGHUP+SIGCONT the stopped wrapper.
    member = subprocess.Popen(["sleep", "60"], process_group=rank.wrapper.pid)
    try:
        os.kill(rank.wrapper.pid, signal.SIGSTOP)
        killed_at = time.monotonic()
        rank.launcher.kill()
        rank.launcher.wait()
        assert gone_within(rank.tree, GONE_WITHIN_SECONDS)
        assert time.monotonic() - killed_at >= 0.5 + 1.0  # the grace and the margin
    finally:
        member.kill()
        member.wait()
    lines = endings.read(
        host_directory(isolated_environment) / endings.ENDINGS_NAME, system.boot_id()
    )
    (ended,) = [line for line in lines if line.event == "ended"]
    assert (ended.identity, ended.how, ended.by, ended.step) == (
        rank.wrapper,
        "killed",
        "exec",
        "grace",
    )
    assert "its keeper killed it" in ended.why
