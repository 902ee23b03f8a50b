"""`exo-orphan-guard exec` under a stand-in of `mlx.launch`: when the launcher is
SIGKILLed, its ranks and their children die with it, and a wrapper whose watch cannot
act is recorded and swept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import launch_scenario, scenarios
from exo_orphan_guard.rig.launch_scenario import RankKind, StartedLauncher
from tests.helpers.cli import run_cli
from tests.helpers.processes import describe, gone_within
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and uses pidfds")

ALL_KINDS: list[RankKind] = ["idle", "gil", "child", "deaf"]
RANK_GRACE = 1.5


@pytest.fixture
def launchers() -> Iterator[list[StartedLauncher]]:
    started: list[StartedLauncher] = []
    yield started
    for launcher in started:
        launch_scenario.cleanup(launcher)


@pytest.mark.parametrize("stdin_hup", [False, True], ids=["watch", "watch+stdin-hup"])
def test_ranks_and_their_children_die_with_the_launcher(
    launchers: list[StartedLauncher], isolated_environment: Path, stdin_hup: bool
) -> None:
    """Asked first: SIGTERM, which every rank but the deaf one dies of at once (its
    default action works in native code too); SIGKILL for the deaf one at the grace.
    The control (once): without the wrapper, the same ranks outlive that wait."""
    unwrapped: StartedLauncher | None = None
    if not stdin_hup:
        unwrapped = launch_scenario.start_launcher(
            ALL_KINDS, wrapper=[], registry=isolated_environment
        )
        launchers.append(unwrapped)
    control = [] if unwrapped is None else unwrapped.all_processes()
    launcher = launch_scenario.start_launcher(
        ALL_KINDS,
        wrapper=launch_scenario.wrapper_words(stdin_hup=stdin_hup, grace=RANK_GRACE),
        registry=isolated_environment,
    )
    launchers.append(launcher)
    time.sleep(scenarios.GIL_SETTLE_SECONDS)  # the GIL ranks are inside their native call
    deaf = next(rank for rank in launcher.ranks if rank.kind == "deaf")
    assert deaf.wrapper is not None
    deaf_tree = set(deaf.tree)
    tracked = launcher.all_processes()
    assert len(tracked) == 9  # 4 wrappers, 4 ranks, 1 child (keepers not counted)
    if unwrapped is not None:
        launch_scenario.kill_launcher(unwrapped)
    killed_at = launch_scenario.kill_launcher(launcher)
    exits = scenarios.wait_gone(tracked, RANK_GRACE + 3.0)
    late = [identity.pid for identity, seen in exits.items() if seen is None]
    assert not late, f"alive after the launcher's SIGKILL and the grace: {describe(late)}"
    asked = [seen - killed_at for who, seen in exits.items() if seen and who not in deaf_tree]
    told = [seen - killed_at for who, seen in exits.items() if seen and who in deaf_tree]
    # At once, not at the grace; how soon is `make bench`'s launch section.
    assert max(asked) < RANK_GRACE, f"ranks that die of SIGTERM took {max(asked):.2f} s"
    assert min(told) >= RANK_GRACE
    wrapper_endings = endings.latest(
        endings.read(host_directory(isolated_environment) / endings.ENDINGS_NAME, system.boot_id())
    )
    assert wrapper_endings[deaf.wrapper].how == "killed"
    assert wrapper_endings[deaf.wrapper].by == "exec"
    assert scenarios.alive(control) == control


def test_the_wrapper_is_recorded_and_a_sweep_kills_it_once_its_launcher_is_gone(
    launchers: list[StartedLauncher], isolated_environment: Path
) -> None:
    # The wrapper is stopped, as if it were stuck: it cannot act, and its keeper waits
    # its grace (10 s) and a margin before it ends it. The sweep, within that time,
    # must see it as a runner of a dead worker.
    launcher = launch_scenario.start_launcher(
        ["idle"],
        wrapper=launch_scenario.wrapper_words(stdin_hup=False),
        registry=isolated_environment,
    )
    launchers.append(launcher)
    rank = launcher.ranks[0]
    assert rank.wrapper is not None
    # The wrapper arms its watch (and writes its record) just after it starts the rank.
    directory = host_directory(isolated_environment)
    assert wait_until(lambda: any(directory.glob("runner-*.json")), 10.0)
    records = list(directory.glob("runner-*.json"))
    assert [path.name for path in records] == [f"runner-{rank.wrapper.pid}.json"]
    record = json.loads(records[0].read_text())
    assert record["worker"]["pid"] == launcher.process.pid
    assert record["labels"]["wrapped"].endswith("launch_scenario rank idle 0")

    def sweep() -> dict[str, Any]:
        completed = run_cli("sweep", "--json", "--registry-only")
        assert completed.returncode == 0, completed.stderr
        document: dict[str, Any] = json.loads(completed.stdout)
        return document

    spared = sweep()["spared"]
    assert [entry["pid"] for entry in spared] == [rank.wrapper.pid]
    assert spared[0]["reason"] == f"its worker {launcher.process.pid} is alive"

    # A member whose parent (this test) sits outside the group keeps the group from
    # being orphaned, so the kernel does not SIGHUP+SIGCONT the stopped wrapper.
    keeper = subprocess.Popen(["sleep", "60"], process_group=rank.wrapper.pid)
    try:
        os.kill(rank.wrapper.pid, signal.SIGSTOP)
        launch_scenario.kill_launcher(launcher)
        time.sleep(0.3)
        assert scenarios.alive(list(rank.tree)) == list(rank.tree)
        report = sweep()
        assert [suspect["pid"] for suspect in report["suspects"]] == [rank.wrapper.pid]
        assert report["suspects"][0]["rule"] == "registry"
        assert gone_within(list(rank.tree), 2.0)
    finally:
        keeper.kill()
        keeper.wait()
