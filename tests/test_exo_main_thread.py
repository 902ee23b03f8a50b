"""exo's real runner, its worker SIGKILLed and the runner then stopped (SIGSTOP), as
the sweeps of before froze their targets: a sweep by hand and the worker's start-up
sweep each end it through Python, SIGINT alone, in every one of 20 rounds, at the
five versions, but where exo's own exit cannot end: a worker SIGKILLed while holding
one of its channels' `closed` locks leaves the runner's `finally` blocked on it, so
SIGINT is followed by SIGKILL at the busy wait. Those rounds are told apart by the
lock's value as the runner maps it, read before the sweep (`tests/helpers/shared_locks`).

exo main's idle runner waits in `_work_queue.get()` beside its task-reader thread:
a SIGINT that lands on that thread is lost, and before the fix the sweep's SIGINT to
a frozen runner landed there in 2 to 4 of 8 trials. Needs EXO_SRC and MLX_LM_SRC, as
`make test-exo`, and a private pid namespace (`scripts/confined`)."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import settings, signalling
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from tests.helpers.cli import run_cli
from tests.helpers.exo_trees import exo_tree, exo_venv, exo_worker
from tests.helpers.exo_trees import versions as exo_versions
from tests.helpers.shared_locks import held_locks
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.exo, pytest.mark.skipif(sys.platform != "linux", reason="Linux only")]
ROUNDS = int(os.environ.get("EOG_EXO_MAIN_THREAD_ROUNDS") or 20)
BUSY_WAIT = "20"
"""Short, so that a SIGINT lost on another thread shows as SIGKILL in seconds; long
beside exo's unwinding (0.4-1.4 s)."""
Sweeper = Literal["by hand", "worker's start-up"]
CLEAN = (["SIGINT"], "clean")
BLOCKED_EXIT = (["SIGINT", "SIGKILL"], "killed")


@dataclass(frozen=True)
class Round:
    held: list[str]
    """The exit locks the dead worker left held."""
    signals: list[str]
    ended: str

    def as_expected(self) -> bool:
        return (self.signals, self.ended) == (BLOCKED_EXIT if self.held else CLEAN)


def _stopped_orphan(report: dict[str, object]) -> ProcessIdentity:
    runner = identity_of(int(str(report["runner_pid"])))
    assert runner is not None
    os.kill(int(str(report["worker_pid"])), signal.SIGKILL)
    assert wait_until(lambda: system.parent_pid(runner.pid) != report["worker_pid"], 10.0)
    assert signalling.send(runner, signal.SIGSTOP) == "sent"
    assert wait_until(lambda: system.is_stopped(runner.pid) is True, 10.0)
    return runner


def _ended(sweeper: Sweeper, registry: Path, runner: ProcessIdentity) -> tuple[list[str], str]:
    """The signals the sweep sent the runner, and how it says the runner ended."""
    if sweeper == "by hand":
        env = dict(os.environ, **{settings.BUSY_WAIT_ENV: BUSY_WAIT})
        completed = run_cli("sweep", "--json", "--dir", str(registry), env=env, timeout=120)
        results = json.loads(completed.stdout)["results"]
        (result,) = [result for result in results if result["pid"] == runner.pid]
        return list(result["signals"]), str(result["ended"])
    report = sweep(registry_dir=registry)  # what `guard_exo_worker` runs before the plan loop
    (ended,) = [result for result in report.results if result.target == runner]
    return list(ended.signals), str(ended.ended)


@exo_versions()
@pytest.mark.machine_wide
@pytest.mark.parametrize("sweeper", ["by hand", "worker's start-up"])
def test_a_stopped_real_runner_is_unwound_through_python_every_time(
    version: str,
    sweeper: Sweeper,
    exo_work: Path,
    exo_venv_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(settings.BUSY_WAIT_ENV, BUSY_WAIT)
    tree = exo_tree(exo_work, version, patched=False)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    rounds: list[Round] = []
    for _ in range(ROUNDS):
        with exo_worker(tree, venv, version, guard=False) as report:
            locks: dict[str, str] = report["exit_locks"]
            assert len(locks) >= 2, locks  # the event and task channels at least
            runner = _stopped_orphan(report)
            held = held_locks(runner.pid, locks.values())
            signals, ended = _ended(sweeper, Path(str(report["registry"])), runner)
            rounds.append(Round(held, signals, ended))
            assert scenarios.wait_gone([runner], 10.0)[runner] is not None
    held = sum(bool(round_.held) for round_ in rounds)
    print(f"\n{version}, {sweeper}: {ROUNDS} rounds, {held} with an exit lock held")
    assert all(round_.as_expected() for round_ in rounds), rounds
