"""What the exec wrapper watches, and what it writes down: its launcher, its keeper,
its registry record and its endings lines.

- The launcher (the wrapper's parent: `mlx.launch` for a local rank, the ssh session
  for a remote one): a thread waits for its exit (a pidfd, kqueue on macOS) and wakes
  the wrapper's loop through a pipe. The wrapper's main thread runs nothing but its own
  short Python, so a thread is all it takes: no signal, no PR_SET_PDEATHSIG.
- The keeper (`exec_keeper`): forked once the command runs, and again if it dies
  while the wrapper lives.
- The registry record, as a runner's (labels `wrapped`, `mlx_rank`): `scan` and
  `sweep` see a wrapper whose launcher is gone. The endings log: `begun` when its
  launcher's death starts the stop (so that a sweep waits the grace), `ended` when the
  command is gone.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

from loguru import logger

from .. import system
from ..records import endings
from ..records.registry import Registry
from ..system import settings
from ..system.identity import ProcessIdentity
from ..system.once import warn_once
from .ending_plan import EndingPlan, record
from .exec_keeper import Kept, start_keeper
from .runner_watch import WatchedRunner, record_runner
from .waiters import usable_waiters, wait_for_exit

MAX_KEEPERS: Final = 8
"""Keepers forked by one wrapper: one that keeps dying must not be replaced forever."""


@final
@dataclass(frozen=True, slots=True)
class Watched:
    """What the wrapper hands over: itself, its launcher, its command."""

    me: ProcessIdentity
    launcher: ProcessIdentity | None
    """None: the parent is init (pid 1), which never dies."""
    command: ProcessIdentity | None
    group: int | None
    grace: float
    labels: Mapping[str, str]
    prefix: str
    """How the wrapper's lines begin (`exo-orphan-guard exec (rank 1)`)."""


@final
class ExecWatch:
    def __init__(self, watched: Watched, wake: int) -> None:
        """`wake`: a pipe's write end, written to once the launcher is gone."""
        self.watched = watched
        self._launcher_gone = False
        self._told = False
        registry, problem = Registry.open(settings.registry_dir(), create=True)
        if registry is None and problem is not None:
            warn_once(f"{watched.prefix}: {problem}; this wrapper is not recorded")
        self._plan = EndingPlan(
            grace=watched.grace,
            begun=None,
            endings_path=None if registry is None else str(registry.path / endings.ENDINGS_NAME),
            boot_id=system.boot_id(),
            by="exec",
            labels=dict(watched.labels),
        )
        self._keeper: int | None = None
        self._keepers = 0
        self._start_keeper()
        if registry is not None and watched.launcher is not None:
            runner = WatchedRunner(
                watched.me, watched.launcher, watched.group, watched.labels, watched.grace
            )
            record_runner(registry, runner, watched.grace)
        if watched.launcher is not None:
            threading.Thread(
                target=self._wait_for_the_launcher,
                args=(watched.launcher, wake),
                name="exo-orphan-guard-launcher-wait",
                daemon=True,
            ).start()

    def launcher_news(self) -> str | None:
        """Once, after the launcher died: that it did (None before, and after)."""
        launcher = self.watched.launcher
        if not self._launcher_gone or self._told or launcher is None:
            return None
        self._told = True
        return f"its launcher (pid {launcher.pid}) is gone"

    def _wait_for_the_launcher(self, launcher: ProcessIdentity, wake: int) -> None:
        wait_for_exit(launcher, usable_waiters(launcher))
        self._launcher_gone = True
        with contextlib.suppress(OSError):
            os.write(wake, b"\0")

    def _start_keeper(self) -> None:
        watched = self.watched
        kept = Kept(
            wrapper=watched.me,
            launcher=watched.launcher,
            command=watched.command,
            group=watched.group,
            grace=watched.grace,
            endings_path=self._plan.endings_path,
            boot_id=self._plan.boot_id,
            labels=self._plan.labels,
        )
        self._keepers += 1
        try:
            self._keeper = start_keeper(kept)
        except OSError as error:
            self._keeper = None
            logger.warning(
                f"{watched.prefix}: could not fork its keeper ({error.strerror}): "
                "if this wrapper is killed, its command outlives it"
            )

    def replace_a_dead_keeper(self) -> None:
        """Reap the keeper if it died, and fork another (the wrapper lives on)."""
        if self._keeper is None:
            return
        try:
            reaped, _ = os.waitpid(self._keeper, os.WNOHANG)
        except ChildProcessError:
            reaped = self._keeper
        if reaped == 0:
            return
        dead, self._keeper = self._keeper, None
        if self._keepers >= MAX_KEEPERS:
            logger.warning(
                f"{self.watched.prefix}: its keeper (pid {dead}) died, the "
                f"{MAX_KEEPERS}th: if this wrapper is killed, its command outlives it"
            )
            return
        self._start_keeper()
        if self._keeper is not None:
            logger.warning(
                f"{self.watched.prefix}: its keeper (pid {dead}) died: started another "
                f"(pid {self._keeper})"
            )

    def begun(self) -> None:
        """The launcher is gone and the stop begins: a sweep waits for the grace."""
        deadline = time.monotonic() + self.watched.grace
        record(self._plan, self.watched.me, None, None, "its launcher died", deadline=deadline)

    def ended(self, how: endings.How, after: float, why: str) -> None:
        step: endings.Step = "grace" if how == "killed" else "exit"
        record(self._plan, self.watched.me, how, after, why, step=step)


def rank_prefix(base: str) -> str:
    """`base`, with the mlx rank when there is one."""
    rank = os.environ.get("MLX_RANK")
    return base if rank is None else f"{base} (rank {rank})"
