"""exo's main process stopped by Ctrl-C while its worker's start-up sweep waits, for
bench/exo_sweep_stop.py.

Run it with the python of an exo venv (``scripts/exo-venv``), from a tree with the
PR in (exo main or v1.0.71), ``EXO_HOME`` an absolute scratch directory::

    <venv>/bin/python tests/exo_support/sweep_stop_node.py --scratch D

It imports nothing of exo_orphan_guard. First it leaves behind what a dead exo
leaves: a "runner" (a ``--multiprocessing-fork`` child of a worker, recorded by exo's
own ``record_runner``) whose worker is then SIGKILLed; the runner takes SIGINT
without ending (a handler that notes it), so the sweep waits its whole bound for it.
Then exo's own stop, as ``exo.main`` has it: ``mp.set_start_method("spawn")``,
``Node.run`` installing ``signal.signal(SIGINT, ...)`` that cancels its task group,
exo's REAL ``Worker.run`` inside it (its ``InfoGatherer`` a stand-in that only
waits). One JSON line on stdout, ``ready``, once the sweep waits (the leftover noted
its SIGINT), or with the guard off once exo's plan loop first plans; the caller then
sends SIGINT to this process and times its exit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_LEFTOVER = """
import os, signal, sys, threading
from pathlib import Path
from exo.worker.runner.runner_record import record_runner
note = Path(sys.argv[1])
record_runner(Path(sys.argv[2]), os.getppid())
signal.signal(signal.SIGINT, lambda *_: note.touch())
print(os.getpid(), flush=True)
threading.Event().wait()
"""
_WORKER = """
import subprocess, sys
runner = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], *sys.argv[2:], "--multiprocessing-fork"],
    stdout=subprocess.PIPE,
)
print(int(runner.stdout.readline()), flush=True)
sys.stdin.read()
"""


def emit(**fields: Any) -> None:
    print(json.dumps({"at": time.monotonic(), **fields}), flush=True)


def leave_a_leftover(note: Path, records: Path) -> int:
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, _LEFTOVER, str(note), str(records)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert worker.stdout is not None
    pid = int(worker.stdout.readline())
    worker.kill()
    worker.wait()
    return pid


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scratch", type=Path, required=True)
    args = parser.parse_args()
    import anyio
    import exo.worker.main as worker_main
    from exo.shared.constants import EXO_ORPHAN_GUARD, EXO_RUNNER_RECORDS_DIR
    from exo.shared.types.commands import ForwarderCommand, ForwarderDownloadCommand
    from exo.shared.types.common import NodeId
    from exo.shared.types.events import Event, IndexedEvent
    from exo.utils.channels import channel

    note = args.scratch / "leftover-took-sigint"
    leftover = leave_a_leftover(note, EXO_RUNNER_RECORDS_DIR)

    class QuietInfoGatherer:
        def __init__(self, *_: object) -> None: ...

        async def run(self) -> None:
            await anyio.sleep_forever()

    worker_main.InfoGatherer = QuietInfoGatherer  # pyright: ignore
    real_plan = worker_main.plan
    planned: list[bool] = []

    def plan(*arguments: Any, **keywords: Any) -> Any:
        if not planned:
            planned.append(True)
            if not EXO_ORPHAN_GUARD:
                emit(event="ready", leftover=leftover, guard=False)
        return real_plan(*arguments, **keywords)

    worker_main.plan = plan  # pyright: ignore

    async def run() -> None:
        event_sender, _ = channel[Event]()
        _, event_receiver = channel[IndexedEvent]()
        command_sender, _ = channel[ForwarderCommand]()
        download_command_sender, _ = channel[ForwarderDownloadCommand]()
        worker = worker_main.Worker(
            NodeId("node-a"),
            event_receiver=event_receiver,
            event_sender=event_sender,
            command_sender=command_sender,
            download_command_sender=download_command_sender,
            api_port=52415,
        )
        async with anyio.create_task_group() as tg:
            # exo's Node.run: SIGINT and SIGTERM cancel its task group.
            signal.signal(signal.SIGINT, lambda _, __: tg.cancel_scope.cancel())
            signal.signal(signal.SIGTERM, lambda _, __: tg.cancel_scope.cancel())
            tg.start_soon(worker.run)
            if EXO_ORPHAN_GUARD:
                while not note.exists():
                    await anyio.sleep(0.005)
                emit(event="ready", leftover=leftover, guard=True)

    mp.set_start_method("spawn", force=True)
    anyio.run(run)
    emit(event="stopped")


if __name__ == "__main__":
    main()
