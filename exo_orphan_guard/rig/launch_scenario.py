"""A launcher shaped like `mlx.launch`, its ranks, and the kill that orphans them.

The launcher starts each rank the way `mlx.launch` starts a local one:
`Popen(script, shell=True, executable="/bin/bash", stdin=PIPE, stdout=PIPE)`, where the
script `exec`s the rank command, so the rank's parent is the launcher and its stdin
is the launcher's pipe. It relays each rank's one-line JSON report and then waits to
be killed. With `wrap`, the command is `exo-orphan-guard exec [--stdin-hup] -- ...`.
Shared by the tests, the benchmark and `make demo`.

    python -m exo_orphan_guard.rig.launch_scenario launcher '<LaunchSpec JSON>'
    python -m exo_orphan_guard.rig.launch_scenario rank KIND
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict, cast, final

from ..system import settings
from ..system.identity import ProcessIdentity, identity_of
from .json_lines import JsonLines
from .scenarios import alive, wait_gone

RankKind = Literal["idle", "gil", "child", "deaf"]
"""idle: sleeps in Python. gil: holds the GIL in native code (as in MLX init). child:
has a child process of its own. deaf: ignores SIGTERM and holds the GIL."""

_REPORT_TIMEOUT_SECONDS = 30.0
_FOREVER_SECONDS = 3600


class LaunchSpec(TypedDict):
    ranks: list[RankKind]
    wrapper: list[str]
    """The words before the rank command: empty, or the `exec` wrapper with its options."""
    python: str


class RankReport(TypedDict):
    rank: int
    pid: int
    ppid: int
    children: list[int]


@final
@dataclass(frozen=True, slots=True)
class LaunchedRank:
    kind: RankKind
    identity: ProcessIdentity
    """The rank command's own process (python)."""
    wrapper: ProcessIdentity | None
    children: tuple[ProcessIdentity, ...]

    @property
    def tree(self) -> tuple[ProcessIdentity, ...]:
        wrapper = () if self.wrapper is None else (self.wrapper,)
        return (*wrapper, self.identity, *self.children)


@final
@dataclass(slots=True)
class StartedLauncher:
    process: subprocess.Popen[bytes]
    ranks: tuple[LaunchedRank, ...]

    def all_processes(self) -> list[ProcessIdentity]:
        return [identity for rank in self.ranks for identity in rank.tree]


def wrapper_words(*, stdin_hup: bool, grace: float | None = None) -> list[str]:
    """`exo-orphan-guard exec` as run by this Python, with options."""
    words = [sys.executable, "-m", "exo_orphan_guard", "exec"]
    if stdin_hup:
        words.append("--stdin-hup")
    if grace is not None:
        words += ["--grace", f"{grace!r}"]
    return [*words, "--"]


def start_launcher(
    kinds: Sequence[RankKind],
    *,
    wrapper: Sequence[str],
    registry: Path,
    extra_env: Mapping[str, str] | None = None,
) -> StartedLauncher:
    """A launcher whose ranks have all reported (the GIL ones are about to hold it)."""
    spec = LaunchSpec(ranks=list(kinds), wrapper=list(wrapper), python=sys.executable)
    env = dict(os.environ)
    env[settings.DIR_ENV] = str(registry)
    env.pop(settings.WORKER_ENV, None)
    env.update(extra_env or {})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exo_orphan_guard.rig.launch_scenario",
            "launcher",
            json.dumps(spec),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=None if os.environ.get("EOG_SCENARIO_STDERR") == "1" else subprocess.DEVNULL,
        env=env,
    )
    reports: dict[int, RankReport] = {}
    try:
        deadline = time.monotonic() + _REPORT_TIMEOUT_SECONDS
        assert process.stdout is not None
        lines = JsonLines(process.stdout)
        while len(reports) < len(kinds):
            document = lines.next(max(0.0, deadline - time.monotonic()))
            if document is None:
                raise RuntimeError(f"launcher {process.pid}: the ranks did not all report")
            report = cast(RankReport, document)
            reports[report["rank"]] = report
    except BaseException:
        _kill_reported(process, reports.values())
        raise
    ranks = tuple(
        LaunchedRank(
            kind=kind,
            identity=_identity(reports[index]["pid"]),
            wrapper=_identity(reports[index]["ppid"]) if wrapper else None,
            children=tuple(_identity(pid) for pid in reports[index]["children"]),
        )
        for index, kind in enumerate(kinds)
    )
    return StartedLauncher(process, ranks)


def kill_launcher(launcher: StartedLauncher) -> float:
    """SIGKILL the launcher's pid alone and reap it; the monotonic time just before."""
    killed_at = time.monotonic()
    os.kill(launcher.process.pid, signal.SIGKILL)
    launcher.process.wait()
    return killed_at


def cleanup(launcher: StartedLauncher) -> None:
    """Leave nothing behind: the launcher, every rank, wrapper and child."""
    _kill_reported(launcher.process, ())
    leftovers = alive(launcher.all_processes())
    for identity in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(identity.pid, signal.SIGKILL)
    wait_gone(leftovers, 5.0)


def _kill_reported(process: subprocess.Popen[bytes], reports: object) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()
    for report in cast(Sequence[RankReport], reports):
        for pid in (report["pid"], *report["children"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _identity(pid: int) -> ProcessIdentity:
    identity = identity_of(pid)
    if identity is None:
        raise RuntimeError(f"process {pid} is gone right after it reported")
    return identity


def launcher_main(spec: LaunchSpec) -> None:
    ranks: list[subprocess.Popen[bytes]] = []
    for index, kind in enumerate(spec["ranks"]):
        command = [
            *spec["wrapper"],
            spec["python"],
            "-m",
            "exo_orphan_guard.rig.launch_scenario",
            "rank",
            kind,
            str(index),
        ]
        script = f"exec {shlex.join(command)}"
        ranks.append(
            subprocess.Popen(
                script,
                shell=True,
                executable="/bin/bash",
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        )
    for rank in ranks:
        assert rank.stdout is not None
        line = rank.stdout.readline()
        if not line:
            raise SystemExit(f"rank {rank.pid} ended before it reported")
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
    while True:
        time.sleep(_FOREVER_SECONDS)


def rank_main(kind: RankKind, index: int) -> None:
    children: list[int] = []
    if kind == "child":
        children.append(subprocess.Popen(["sleep", str(_FOREVER_SECONDS)]).pid)
    if kind == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    report = RankReport(rank=index, pid=os.getpid(), ppid=os.getppid(), children=children)
    print(json.dumps(report), flush=True)
    if kind in ("gil", "deaf"):
        # Blocks in native code without releasing the GIL, as mx.distributed.init() does.
        ctypes.PyDLL(None).sleep(_FOREVER_SECONDS)
    while True:
        time.sleep(_FOREVER_SECONDS)


if __name__ == "__main__":
    if sys.argv[1] == "launcher":
        launcher_main(cast(LaunchSpec, json.loads(sys.argv[2])))
    else:
        rank_main(cast(RankKind, sys.argv[2]), int(sys.argv[3]))
