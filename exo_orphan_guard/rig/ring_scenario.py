"""A real MLX distributed group over loopback, and the orphan that breaks the next one.

MLX's ring backend (`mlx[cpu]` on Linux) is the stand-in for exo's RDMA groups: a rank
still inside `mx.distributed.init()` when its worker dies keeps its listening socket
and its connection attempts, and the next group on the same ports hangs without a
word, the way a node with an orphan holding queue pairs fails RTR. The scenario: a
worker starts rank 0 alone (so it sits in init, holding the GIL), is SIGKILLed, and
a new worker starts ranks 0 and 1 on the same ports. A worker can also run the
start-up sweep of exo's worker hook before it spawns anything (`sweep_first`), and
spawn idle runners beside its ranks, as a node serving another model would have.

    python -m exo_orphan_guard.rig.ring_scenario '<GroupSpec JSON>'   # the worker
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, cast, final

from ..system import settings
from ..system.identity import ProcessIdentity, identity_of
from .json_lines import JsonLines
from .notes import RunnerNotes
from .ring_ports import free_loopback_ports, wait_listening, write_hostfile
from .scenarios import alive, kill_started, wait_gone
from .stand_in_exo import as_exo_main

as_exo_main(__name__)  # in its ranks too, which re-run this module

if TYPE_CHECKING:
    from loguru import Message

_REPORT_TIMEOUT_SECONDS = 30.0
NEXT_GROUP_STAGGER_SECONDS = 0.5
"""After a rank says it is entering init: time for it to bind and start connecting."""


class GroupSpec(TypedDict):
    ranks: list[int]
    """Spawned in this order, `stagger` seconds apart (nodes never start together)."""
    stagger: float
    hostfile: str
    guard: bool
    idle_runners: NotRequired[int]
    """Spawned before the ranks; they only sleep."""
    sweep_first: NotRequired[bool]
    """Run the start-up sweep of exo's worker hook (`guard_exo_worker`) before spawning,
    relaying its log lines as `LogReport`s."""
    hold_mb: NotRequired[int]
    """Once the group has formed, each rank holds this much in MLX arrays."""
    then: NotRequired[RankBehaviour]
    """What a formed rank does until its worker dies (default idle)."""
    notes: NotRequired[str]
    """Where ranks write what happened to them (`notes.RunnerNotes`)."""


RankBehaviour = Literal["idle", "loop", "catch"]
"""idle: sleeps, catches nothing (WorkerGone unwinds it). loop: runs MLX operations
over its arrays, catches nothing. catch: sleeps, catches WorkerGone and lets go of
its arrays and group itself."""


class RankReport(TypedDict):
    rank: int
    """For an idle runner: its index."""
    pid: int
    event: Literal["init", "sum", "idle"]
    """"init": about to call mx.distributed.init(); "sum": all_sum done; "idle": an
    idle runner is up."""
    value: float


class LogReport(TypedDict):
    event: Literal["log"]
    level: str
    message: str


def mlx_available() -> bool:
    try:
        import mlx.core  # noqa: F401  # pyright: ignore[reportMissingImports, reportUnusedImport]
    except ImportError:
        return False
    return True


def rank_main(rank: int, spec: GroupSpec, report: multiprocessing.connection.Connection) -> None:
    if spec["guard"]:
        from exo_orphan_guard import guard_runner

        guard_runner(runner_id=f"rank-{rank}", instance_id="mlx-ring")
    os.environ["MLX_RANK"] = str(rank)
    os.environ["MLX_HOSTFILE"] = spec["hostfile"]
    import mlx.core as mx  # pyright: ignore[reportMissingImports]

    notes = RunnerNotes(spec.get("notes", ""))
    # Registered before the guard's own release (at exit, the last registered runs
    # first): what MLX still holds once the guard has collected and cleared its cache.
    atexit.register(lambda: notes.write("exit", **_mlx_memory(mx)))
    _send(report, RankReport(rank=rank, pid=os.getpid(), event="init", value=0.0))
    group = mx.distributed.init(backend="ring", strict=True)  # pyright: ignore
    total = mx.distributed.all_sum(mx.array([float(rank + 1)]), group=group)  # pyright: ignore
    mx.eval(total)  # pyright: ignore
    held = _hold(mx, spec.get("hold_mb", 0))
    then = spec.get("then", "idle")
    value = float(total.item())  # pyright: ignore
    try:
        # Ready is said from inside the block the test inspects: the worker is killed
        # as soon as every rank has said it, and a WorkerGone that came between the
        # report and the `try` would unwind outside it, noting nothing.
        notes.write("holding", **_mlx_memory(mx))
        _send(report, RankReport(rank=rank, pid=os.getpid(), event="sum", value=value))
        # Steps of a few ms, like a decode step: a signal is handled between two.
        step = held[0][: 2**20]
        while then == "loop":
            mx.eval(mx.sum(step * 1.0001))  # pyright: ignore
        while True:
            time.sleep(3600)
    except BaseException as error:
        notes.write("raised", type=type(error).__name__)
        if then != "catch" or type(error).__name__ != "WorkerGone":
            raise
        del held, group, total
        notes.write("released")
    finally:
        notes.write("finally")


def _hold(mx: Any, megabytes: int) -> list[Any]:
    if megabytes <= 0:
        return [mx.zeros((1,))]
    arrays = [mx.ones((megabytes * 2**20 // 4,), dtype=mx.float32)]
    mx.eval(*arrays)
    return arrays


def _mlx_memory(mx: Any) -> dict[str, int]:
    return {"active": int(mx.get_active_memory()), "cache": int(mx.get_cache_memory())}


def idle_runner_main(
    index: int, guard: bool, report: multiprocessing.connection.Connection
) -> None:
    if guard:
        from exo_orphan_guard import guard_runner

        guard_runner(runner_id=f"idle-{index}", instance_id="other-model")
    _send(report, RankReport(rank=index, pid=os.getpid(), event="idle", value=0.0))
    while True:
        time.sleep(3600)


def _send(connection: multiprocessing.connection.Connection, report: RankReport) -> None:
    with contextlib.suppress(OSError):
        connection.send(report)


def worker_main(spec: GroupSpec) -> None:
    """Spawn the ranks (exo's way), relay every rank report as a JSON line, wait."""
    if spec["guard"]:
        from exo_orphan_guard import prepare_worker

        prepare_worker()
    if spec.get("sweep_first", False):
        _sweep_at_start()
    context = multiprocessing.get_context("spawn")
    readers: list[multiprocessing.connection.Connection] = []
    for index in range(spec.get("idle_runners", 0)):
        reader, writer = multiprocessing.Pipe(duplex=False)
        context.Process(
            target=idle_runner_main, args=(index, spec["guard"], writer), daemon=True
        ).start()
        writer.close()
        readers.append(reader)
    for index, rank in enumerate(spec["ranks"]):
        if index:
            time.sleep(spec["stagger"])
        reader, writer = multiprocessing.Pipe(duplex=False)
        context.Process(target=rank_main, args=(rank, spec, writer), daemon=True).start()
        writer.close()
        readers.append(reader)
    while readers:
        for reader in multiprocessing.connection.wait(readers):
            assert isinstance(reader, multiprocessing.connection.Connection)
            try:
                print(json.dumps(reader.recv()), flush=True)
            except EOFError:
                readers.remove(reader)
    while True:
        time.sleep(3600)


def _sweep_at_start() -> None:
    """The start-up sweep exo's worker hook runs (`guard_exo_worker`, which also starts a
    guardian, left out here), logged as it logs it; its log lines go to stdout as
    reports. Awaited here before any rank starts."""
    from loguru import logger

    from exo_orphan_guard import sweep
    from exo_orphan_guard.exo.worker import log_report

    def relay(message: Message) -> None:
        record = message.record
        line = LogReport(event="log", level=record["level"].name, message=record["message"])
        print(json.dumps(line), flush=True)

    def waiting(line: str) -> None:
        logger.warning(f"orphan guard: sweep before worker start: {line}")

    logger.remove()
    logger.add(relay, level="INFO", format="{message}")
    log_report(sweep(on_wait=waiting), "worker start")


@final
@dataclass
class RunningGroup:
    process: subprocess.Popen[bytes]
    ranks: dict[int, ProcessIdentity]
    sums: dict[int, float]
    idle: list[ProcessIdentity] = field(default_factory=list[ProcessIdentity])
    logs: list[LogReport] = field(default_factory=list[LogReport])
    reports: JsonLines | None = None

    def read(self, timeout: float) -> RankReport | LogReport | None:
        """The next report, or None at the timeout or when the worker is gone."""
        if self.reports is None:
            assert self.process.stdout is not None
            self.reports = JsonLines(self.process.stdout)
        document = self.reports.next(timeout)
        if document is None:
            return None
        report = cast(RankReport | LogReport, document)
        if report["event"] == "log":
            self.logs.append(report)
        elif report["event"] == "sum":
            self.sums[report["rank"]] = report["value"]
        else:
            identity = identity_of(report["pid"])
            if identity is not None and report["event"] == "init":
                self.ranks[report["rank"]] = identity
            elif identity is not None:
                self.idle.append(identity)
        return report

    @property
    def runners(self) -> list[ProcessIdentity]:
        return [*self.idle, *self.ranks.values()]


def start_group(
    ranks: list[int],
    hostfile: Path,
    *,
    guard: bool,
    registry: Path,
    stagger: float = 0.0,
    idle_runners: int = 0,
    sweep_first: bool = False,
    python: str = sys.executable,
    hold_mb: int = 0,
    then: RankBehaviour = "idle",
    notes: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> RunningGroup:
    """A worker whose ranks have all reported that they are entering init (and whose
    idle runners are up)."""
    env = dict(os.environ)
    env[settings.TOGGLE_ENV] = "1" if guard else "0"
    env[settings.DIR_ENV] = str(registry)
    env.pop(settings.WORKER_ENV, None)
    env.update(extra_env or {})
    spec = GroupSpec(
        ranks=ranks,
        stagger=stagger,
        hostfile=str(hostfile),
        guard=guard,
        idle_runners=idle_runners,
        sweep_first=sweep_first,
        hold_mb=hold_mb,
        then=then,
        notes="" if notes is None else str(notes),
    )
    process = subprocess.Popen(
        [python, "-m", "exo_orphan_guard.rig.ring_scenario", json.dumps(spec)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=None if os.environ.get("EOG_SCENARIO_STDERR") == "1" else subprocess.DEVNULL,
        env=env,
    )
    group = RunningGroup(process, {}, {})
    deadline = time.monotonic() + _REPORT_TIMEOUT_SECONDS
    try:
        while len(group.ranks) < len(ranks) or len(group.idle) < idle_runners:
            if group.read(deadline - time.monotonic()) is None:
                raise RuntimeError("the MLX ranks did not start")
    except BaseException:  # Ctrl-C included: nothing half-started may outlive us
        stop(group)
        raise
    return group


def wait_for_sums(group: RunningGroup, expected: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while len(group.sums) < expected:
        if group.read(deadline - time.monotonic()) is None:
            return False
    return True


def stop(group: RunningGroup) -> None:
    """Kill the worker, whatever it spawned, and every runner it reported."""
    kill_started(group.process)
    leftovers = alive(group.runners)
    for identity in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(identity.pid, signal.SIGKILL)
    wait_gone(leftovers, 5.0)


@final
@dataclass(frozen=True)
class OrphanOutcome:
    guard: bool
    orphan_gone_ms: float | None
    """From the worker's SIGKILL until the rank stuck in init was gone."""
    formed: bool
    sums: dict[int, float]
    form_seconds: float
    """From the kill until the next group's all_sum returned (or the timeout)."""


def orphan_then_next_group(*, guard: bool, timeout: float, scratch: Path) -> OrphanOutcome:
    """Rank 0 stuck in init, its worker SIGKILLed, then a whole new group on the same ports."""
    ports = free_loopback_ports(2)
    hostfile = write_hostfile(scratch, ports)
    registry = scratch / "registry"
    first = start_group([0], hostfile, guard=guard, registry=registry)
    second: RunningGroup | None = None
    try:
        # Its socket bound, or the next group's rank 0 could take the port first.
        if not wait_listening(ports[0]):
            raise RuntimeError(f"rank 0 never listened on port {ports[0]}")
        stuck = first.ranks[0]
        killed_at = time.monotonic()
        first.process.kill()  # SIGKILL of the worker's pid alone
        first.process.wait()
        # Guarded, it goes at once (on a loaded machine, within this); unguarded, never.
        gone = wait_gone([stuck], 10.0 if guard else 1.0)[stuck]
        # Rank 1 first: its connection to rank 0's port finds only the orphan listening.
        second = start_group(
            [1, 0], hostfile, guard=True, registry=registry, stagger=NEXT_GROUP_STAGGER_SECONDS
        )
        formed = wait_for_sums(second, 2, timeout)
        return OrphanOutcome(
            guard=guard,
            orphan_gone_ms=None if gone is None else (gone - killed_at) * 1000,
            formed=formed,
            sums=dict(second.sums),
            form_seconds=time.monotonic() - killed_at,
        )
    finally:
        stop(first)
        if second is not None:
            stop(second)


if __name__ == "__main__":
    worker_main(cast(GroupSpec, json.loads(sys.argv[1])))
