"""Innocent processes that live through the whole test session: the proof that no test
signals what it did not start.

Started before the first test, checked after the last (tests/conftest.py):

- `spawn_child`: a `--multiprocessing-fork` child of a live parent that shows it runs
  exo (the stand-in of exo's extension mapped), both from exo's environment: the shape
  of a live exo worker's runner (a developer's `python -m exo` serving a model while
  `make test` runs; the runner itself shows nothing of exo's);
- `reparented`: a process reparented to init whose argv carries
  `--multiprocessing-fork`, from an environment without exo: some other program's.

Neither is started by a test, and neither carries a token of one: a test's sweep that
takes either (a `--match multiprocessing-fork`, a sweep that is not confined to the
test's own processes) fails the session. Both are detached from the suite (parent
gone, or a parent that is not the suite), so no sweep spares them just for descending
from its caller.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar, final

import psutil

from exo_orphan_guard.sweeper.process_table import SPAWN_CHILD_FLAG
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of, liveness

from .processes import kill_all

T = TypeVar("T")

_START_TIMEOUT_SECONDS: Final = 30.0
_LIVE_PARENT: Final = (
    "import exo_rs, multiprocessing, time\n"
    "if __name__ == '__main__':\n"
    "    child = multiprocessing.get_context('spawn').Process(target=time.sleep, args=(86400,))\n"
    "    child.start()\n"
    "    time.sleep(86400)\n"
)


@final
@dataclass(frozen=True, slots=True)
class Decoys:
    live_parent: ProcessIdentity
    spawn_child: ProcessIdentity
    reparented: ProcessIdentity

    def described(self) -> dict[str, ProcessIdentity]:
        return {
            "the spawn child of a live parent (a live exo runner's shape)": self.spawn_child,
            "its live parent": self.live_parent,
            "a reparented process with --multiprocessing-fork in its argv (not exo)": (
                self.reparented
            ),
        }

    def gone(self) -> list[str]:
        return [name for name, decoy in self.described().items() if liveness(decoy) != "alive"]

    def stop(self) -> None:
        kill_all(list(self.described().values()))


def start_decoys(exo_python: str) -> Decoys:
    parent = _detached([exo_python, "-c", _LIVE_PARENT])
    try:
        child = _wait_for(lambda: _spawn_child_of(parent), "the decoy's spawn child")
        reparented = _detached(
            [sys.executable, "-c", "import time; time.sleep(86400)", SPAWN_CHILD_FLAG]
        )
    except BaseException:
        kill_all([parent])
        raise
    return Decoys(live_parent=parent, spawn_child=child, reparented=reparented)


def _detached(argv: list[str]) -> ProcessIdentity:
    """`argv` started by a shell that exits at once, so that init adopts it."""
    shell = subprocess.run(
        ["/bin/sh", "-c", '"$@" </dev/null >/dev/null 2>&1 & echo $!', "sh", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(shell.stdout.strip())
    return _wait_for(lambda: _running(pid, argv), f"decoy {argv}")


def _running(pid: int, argv: list[str]) -> ProcessIdentity | None:
    try:
        if psutil.Process(pid).cmdline() != argv:
            return None
    except psutil.Error:
        return None
    return identity_of(pid)


def _spawn_child_of(parent: ProcessIdentity) -> ProcessIdentity | None:
    try:
        children = psutil.Process(parent.pid).children()
    except psutil.Error:
        return None
    for child in children:
        try:
            if SPAWN_CHILD_FLAG in child.cmdline():
                return identity_of(child.pid)
        except psutil.Error:
            continue
    return None


def _wait_for(probe: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + _START_TIMEOUT_SECONDS
    while (found := probe()) is None:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what} did not start within {_START_TIMEOUT_SECONDS:g} s")
        time.sleep(0.02)
    return found
