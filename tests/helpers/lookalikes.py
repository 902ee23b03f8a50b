"""Programs that look like exo to a sweep and are not: a script whose
ProcessPoolExecutor (spawn, as on macOS) runs from exo's own environment and crashes,
leaving its workers behind; and what exo's own main module shows, for the stand-ins
that must show it (a console script named `exo`, a package run with `-m`)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from exo_orphan_guard import system
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of

POOL_SCRIPT: Final = """\
import concurrent.futures, multiprocessing, sys, time

def square(x):
    return x * x

if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        assert list(pool.map(square, range(8))) == [x * x for x in range(8)]
        workers = [child.pid for child in multiprocessing.active_children()]
        print(" ".join(map(str, workers)), flush=True)
        time.sleep(3600)  # until it crashes
"""
STANDIN_MAIN: Final = """\
import exo_rs  # as exo's main module imports exo's extension
import multiprocessing, os, sys, time
from exo_standin_runner import entrypoint

def main():
    multiprocessing.set_start_method("spawn", force=True)
    runner = multiprocessing.Process(target=entrypoint, daemon=True)
    runner.start()
    time.sleep(3600)
    return 0
"""
STANDIN_RUNNER: Final = """\
import os, time

def entrypoint():
    # Like exo's runner entrypoint, it imports nothing of exo's main module.
    print(os.getppid(), os.getpid(), flush=True)
    time.sleep(3600)
"""
CONSOLE_SCRIPT: Final = """\
#!{python}
# -*- coding: utf-8 -*-
import sys
from exo_standin_main import main
if __name__ == "__main__":
    sys.exit(main())
"""


@final
@dataclass(frozen=True, slots=True)
class Crashed:
    """A program that crashed (SIGKILLed) and what it left: its spawn children and the
    multiprocessing helpers beside them (its resource tracker)."""

    parent: ProcessIdentity
    children: tuple[ProcessIdentity, ...]
    helpers: tuple[ProcessIdentity, ...]

    @property
    def left(self) -> list[ProcessIdentity]:
        return [*self.children, *self.helpers]


def site_packages(python: str) -> Path:
    (found,) = Path(python).parent.parent.glob("lib/python3*/site-packages")
    return found


def write_exo_main(python: str) -> tuple[str, str]:
    """A stand-in of exo's main module in the environment of `python`, reached as exo's
    is: its console script `<env>/bin/exo`, and a package for `-m`. Their paths."""
    packages = site_packages(python)
    (packages / "exo_standin_main.py").write_text(STANDIN_MAIN)
    (packages / "exo_standin_runner.py").write_text(STANDIN_RUNNER)
    module = packages / "exo_standin_pkg"
    module.mkdir(exist_ok=True)
    (module / "__init__.py").write_text("")
    (module / "__main__.py").write_text(
        "import sys\nfrom exo_standin_main import main\nsys.exit(main())\n"
    )
    script = Path(python).parent / "exo"
    script.write_text(CONSOLE_SCRIPT.format(python=python))
    script.chmod(0o755)
    return str(script), "exo_standin_pkg"


def start_reporting(
    argv: Sequence[str], cwd: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start `argv`; its first stdout line, once written."""
    process = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=cwd
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"{argv} said nothing (exit {process.poll()})"
    return process, line


def crash_a_pool(python: str, directory: Path) -> Crashed:
    """Run the pool script with `python`, then SIGKILL it once its workers are up."""
    script = directory / "pool.py"
    script.write_text(POOL_SCRIPT)
    process, line = start_reporting([python, str(script)], cwd=directory)
    return crash(process, [int(word) for word in line.split()])


def crash(process: subprocess.Popen[str], children: Sequence[int]) -> Crashed:
    """SIGKILL `process` (the pid alone: its children live on, as after a crash)."""
    parent = identity_of(process.pid)
    assert parent is not None
    spawned = [identity for pid in children if (identity := identity_of(pid)) is not None]
    helpers = [
        identity
        for pid in system.child_pids(process.pid)
        if pid not in children and (identity := identity_of(pid)) is not None
    ]
    assert len(spawned) == len(children) > 0
    os.kill(process.pid, signal.SIGKILL)
    process.wait()  # reaped: the kernel reparented its children before it was a zombie
    assert all(system.parent_pid(child.pid) != process.pid for child in spawned)
    return Crashed(parent, tuple(spawned), tuple(helpers))
