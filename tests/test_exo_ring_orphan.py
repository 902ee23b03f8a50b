"""exo's REAL Worker and an orphan left inside ring `init()` on the same ports (issue
35 item 4): the worker's start-up sweep comes first, and exo's node serves meanwhile.

`exo_support/ring_node.py` is an exo node around exo's real Workers, their real,
patched `plan_step` (its first line the series' `await guard_worker()`), exo's own
`plan()` and `RunnerSupervisor`, with a stand-in master. `exo_support/init_site`
notes when each runner enters `mx.distributed.init()`.

1. The first node (`--mode first`, the guard off: an exo that never heard of it, so
   no guardian of its own is around) gets rank 0 of a two-rank ring instance; exo's
   plan hands it `ConnectToGroup` and it sits in ring init (holding the GIL),
   waiting for a rank 1 that never comes. Its node's process is SIGKILLed (its pid
   only): rank 0 is an orphan, still listening on the instance's ports.
2. A second node (`--mode second`) starts on the same ports, with both ranks.

With `EXO_ORPHAN_GUARD=true` and the package, the second node's Workers await the
start-up sweep before their plan loops begin: it ends the orphan (rule `fingerprint`,
SIGTERM, which a runner inside MLX's init cannot delay: exo's runner has no handler
for it), so no runner of the second node enters `init()` while the orphan lives
(watched exactly, through a pidfd), the new group forms, and a ticker on the node's
event loop is served on time meanwhile.

The control, the guard off on the second node: nothing ends the orphan and both new
ranks enter `init()` beside it, on its ports. Whether the group then forms is a coin
toss, so the control asserts only the former and prints the latter: MLX binds its
listener with SO_REUSEPORT, so the new rank 0 listens on the port the orphan still
listens on, and the kernel hands rank 1's connection to either (with the orphan, rank
1 pairs with it and the new rank 0 waits in `accept` for good). The figures print
with `-s`.

Needs EXO_SRC and MLX_LM_SRC, as `make test-exo`, and a private pid namespace
(`scripts/confined`), as every exo test.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig.json_lines import JsonLines
from exo_orphan_guard.rig.ring_ports import free_loopback_ports
from exo_orphan_guard.rig.scenarios import wait_gone
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of, liveness
from tests.helpers.app_quit import exo_for
from tests.helpers.exo_trees import REPO, SUPPORT, exo_tree, exo_venv, versions
from tests.helpers.processes import carrying, kill_all

pytestmark = [
    pytest.mark.exo,
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only (pidfd, /proc)"),
]

TOKEN: Final = "EOG_RING_ORPHAN_TOKEN"
BUSY_WAIT: Final = 2.0
GRACE: Final = 2.0
"""Short bounds, should the sweep's signal not end the orphan at once (SIGKILL after
them): the plan loops wait at most about this long."""
IN_INIT_BOUND: Final = 120.0
"""For the first node's rank 0 to enter init (exo's imports, its runner's spawn)."""
SETTLE: Final = 1.0
"""After its note: well inside MLX's init, its socket bound."""
FORM_BOUND: Final = 90.0
"""From the second node's start until the group formed: its sweep (the busy wait),
two runners spawned and importing exo and MLX on a loaded 2-core machine, and their
ring init. Measured: 5.8 to 11.5 s from the first node's SIGKILL."""
LATE_BOUND: Final = 1.0
"""The event loop's worst lateness while the plan loops waited for the sweep: far
above what a loop that serves on looks like (a few ms), far below a loop blocked
for the sweep (the busy wait, 2 s, at least)."""
STOP_BOUND: Final = 20.0
CONTROL_OBSERVE: Final = 40.0
"""The control's watch, from the second node's start: its ranks in init by about
10 s, and the group formed at once, if it does (measured: 0.2 s after)."""


@dataclass
class Node:
    process: subprocess.Popen[bytes]
    log: Path
    reader: JsonLines
    lines: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])

    def wait_for(
        self, wanted: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        found = next((line for line in self.lines if wanted(line)), None)
        while found is None and time.monotonic() < deadline:
            document = self.reader.next(min(0.5, max(0.0, deadline - time.monotonic())))
            if document is None:
                if self.process.poll() is not None:
                    break
                continue
            assert isinstance(document, dict)
            line: dict[str, Any] = dict(document)  # pyright: ignore[reportUnknownArgumentType]
            self.lines.append(line)
            if wanted(line):
                found = line
        return found

    def events(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] == event]

    def tail(self) -> str:
        return f"{self.lines}\n" + self.log.read_text(errors="replace")[-4000:]


class DeathWatch:
    """When a process (not our child) exited, read from a pidfd the moment it did."""

    def __init__(self, pid: int) -> None:
        self._fd = os.pidfd_open(pid)
        self.died_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                self.died_at = time.monotonic()
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self._fd)


def _environment(scratch: Path, token: str, notes: Path, *, guard: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXO_ORPHAN_GUARD")}
    path_dir = scratch / "guard-path"  # this checkout's package, whatever the .pth names
    if not path_dir.exists():
        path_dir.mkdir()
        (path_dir / "exo_orphan_guard").symlink_to(REPO / "exo_orphan_guard")
    notes.mkdir()
    env.update(
        {
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": os.pathsep.join([str(path_dir), str(SUPPORT / "init_site")]),
            "EOG_INIT_NOTES": str(notes),
            settings.DIR_ENV: str(scratch / "registry"),
            TOKEN: token,
        }
    )
    if guard:
        env[settings.TOGGLE_ENV] = "true"  # exo's own spelling
        env[settings.BUSY_WAIT_ENV] = str(BUSY_WAIT)
        env[settings.GRACE_ENV] = str(GRACE)
    return env


def _start(
    tree: Path, venv: Path, mode: str, ports: list[int], scratch: Path, env: dict[str, str]
) -> Node:
    log = scratch / f"{mode}.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [
                str(venv / "bin" / "python"),
                str(SUPPORT / "ring_node.py"),
                "--mode",
                mode,
                "--ports",
                ",".join(map(str, ports)),
                "--scratch",
                str(scratch / mode),
            ],
            cwd=tree,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    assert process.stdout is not None
    return Node(process, log, JsonLines(process.stdout))


def _init_notes(notes: Path) -> list[dict[str, Any]]:
    """Every `mx.distributed.init()` entry the node's runners noted, earliest first."""
    found: list[dict[str, Any]] = []
    for path in notes.glob("*.jsonl"):
        found.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return sorted(found, key=lambda note: float(note["at"]))


def _wait_note(notes: Path, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := _init_notes(notes):
            return found[0]
        time.sleep(0.05)
    return None


@dataclass
class Outcome:
    orphan: ProcessIdentity
    killed_at: float
    second: Node
    orphan_died_at: float | None
    formed: dict[str, Any] | None
    notes: list[dict[str, Any]]
    runners: list[ProcessIdentity]
    registry: Path
    left_behind: list[int] = field(default_factory=list[int])
    """The orphan or a runner alive after exo's own stop of the second node, or any
    process of the round alive after the guardian's stop."""


@contextlib.contextmanager
def _orphan_then_second_node(
    exo_work: Path,
    cache: Path,
    version: str,
    *,
    guard: bool,
    wait_formed: float,
    stop: bool,
) -> Generator[Outcome]:
    """The first node's rank 0 left in ring init, then the second node on its ports;
    everything the round started killed at the end (`left_behind`: what outlived
    the test's own stop of the second node and of the guardian)."""
    tree, venv = exo_for(exo_work, version, "on-package", exo_tree, exo_venv, cache)
    scratch = exo_work / f"ring-orphan-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    token = uuid.uuid4().hex
    ports = free_loopback_ports(2)
    nodes: list[Node] = []
    watch: DeathWatch | None = None
    try:
        env = _environment(scratch, token, scratch / "notes-first", guard=False)
        first = _start(tree, venv, "first", ports, scratch, env)
        nodes.append(first)
        note = _wait_note(scratch / "notes-first", IN_INIT_BOUND)
        assert note is not None, f"rank 0 never entered init: {first.tail()}"
        time.sleep(SETTLE)
        orphan = identity_of(int(note["pid"]))
        assert orphan is not None, f"rank 0 died in init: {first.tail()}"
        watch = DeathWatch(orphan.pid)  # opened while it is first's child: no pid reuse
        killed_at = time.monotonic()
        first.process.kill()  # SIGKILL of the node's pid alone
        first.process.wait()

        notes = scratch / "notes-second"
        env = _environment(scratch, token, notes, guard=guard)
        second = _start(tree, venv, "second", ports, scratch, env)
        nodes.append(second)
        formed = second.wait_for(lambda line: line["event"] == "formed", wait_formed)
        runners = [
            identity
            for line in second.events("runner")
            if (identity := identity_of(int(line["pid"]))) is not None
        ]
        outcome = Outcome(
            orphan,
            killed_at,
            second,
            watch.died_at,
            formed,
            _init_notes(notes),
            runners,
            scratch / "registry",
        )
        yield outcome
        if not stop:
            return
        # exo's own stop of the second node ends its runners; then the guardian its
        # worker started, all that may still carry the token.
        second.process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            second.process.wait(STOP_BOUND)
        gone = wait_gone([orphan, *runners], STOP_BOUND)
        outcome.left_behind = [identity.pid for identity, at in gone.items() if at is None]
        for identity in carrying(TOKEN, token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(identity.pid, signal.SIGTERM)  # the guardian's stop
        deadline = time.monotonic() + STOP_BOUND
        while carrying(TOKEN, token) and time.monotonic() < deadline:
            time.sleep(0.1)
        outcome.left_behind += [identity.pid for identity in carrying(TOKEN, token)]
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.process.kill()
            node.process.wait()
        kill_all(carrying(TOKEN, token))
        if watch is not None:
            watch.close()
        if not os.environ.get("EOG_RING_ORPHAN_KEEP"):
            shutil.rmtree(scratch, ignore_errors=True)


def _ended_by_sweep(outcome: Outcome) -> endings.Ending | None:
    """The sweep's `ended` line for the orphan (its ending log, in the registry)."""
    path = host_directory(outcome.registry) / endings.ENDINGS_NAME
    found = [
        ending
        for ending in (endings.read(path, system.boot_id()) if path.exists() else [])
        if ending.pid == outcome.orphan.pid and ending.event == "ended" and ending.by == "sweep"
    ]
    return found[-1] if found else None


def _since(at: float | None, outcome: Outcome) -> str:
    return "never" if at is None else f"{at - outcome.killed_at:.2f} s"


def _figures(outcome: Outcome) -> str:
    """What the round measured, from the first node's SIGKILL."""
    formed = None if outcome.formed is None else float(outcome.formed["at"])
    first_init = float(outcome.notes[0]["at"]) if outcome.notes else None
    parts = [
        f"orphan {outcome.orphan.pid} gone {_since(outcome.orphan_died_at, outcome)}",
        f"first init entry of the new node {_since(first_init, outcome)}",
        f"group formed {_since(formed, outcome)}",
    ]
    for sweep in outcome.second.events("sweep"):
        late_max, late_p99 = sweep["late_max"] or 0.0, sweep["late_p99"] or 0.0
        parts.append(
            f"{sweep['node']} waited {sweep['ended'] - sweep['began']:.2f} s for the sweep, "
            f"loop late max {1000 * late_max:.1f} ms, p99 {1000 * late_p99:.1f} ms "
            f"({sweep['ticks']} ticks)"
        )
    return "; ".join(parts)


@versions(("main", "v1.0.71"))
def test_no_new_runner_enters_ring_init_while_the_orphan_lives_and_the_group_forms(
    version: str, exo_work: Path, exo_venv_cache: Path
) -> None:
    with _orphan_then_second_node(
        exo_work, exo_venv_cache, version, guard=True, wait_formed=FORM_BOUND, stop=True
    ) as outcome:
        second = outcome.second
        print(f"\n{_figures(outcome)}")
        assert outcome.formed is not None, f"the group never formed: {second.tail()}"
        assert second.events("node")[0]["package"] is True, second.tail()
        # Both Workers' plan loops waited for the sweep, and the sweep ended the orphan.
        sweeps = second.events("sweep")
        assert sorted(s["node"] for s in sweeps) == ["rank0", "rank1"], second.tail()
        died = outcome.orphan_died_at
        assert died is not None, f"the orphan outlived the group's forming: {second.tail()}"
        assert all(s["began"] < died for s in sweeps), (died, sweeps)
        ended = _ended_by_sweep(outcome)
        assert ended is not None, f"no sweep ended the orphan: {second.tail()}"
        print(f"the sweep's ending of the orphan: {ended.how}, {ended.step}, {ended.signal}")
        # No runner of the new node entered init while the orphan lived.
        assert {int(note["pid"]) for note in outcome.notes} == {r.pid for r in outcome.runners}
        assert len(outcome.runners) == 2, second.tail()
        assert all(note["at"] > died for note in outcome.notes), (died, outcome.notes)
        # The node's event loop served on while the plan loops waited.
        for sweep in sweeps:
            assert sweep["ticks"] > 0, sweep
            assert sweep["late_max"] < LATE_BOUND, sweep
    assert outcome.left_behind == [], outcome.left_behind


def test_control_without_the_guard_new_runners_meet_the_orphan_and_no_group_forms(
    exo_work: Path, exo_venv_cache: Path
) -> None:
    """The same rounds, the guard off on the second node: nothing ends the orphan,
    the new ranks enter init while it lives, and the group does not form."""
    with _orphan_then_second_node(
        exo_work, exo_venv_cache, "main", guard=False, wait_formed=CONTROL_OBSERVE, stop=False
    ) as outcome:
        print(f"\n{_figures(outcome)}")
        assert outcome.orphan_died_at is None
        assert liveness(outcome.orphan) != "gone"
        assert len(outcome.notes) == 2, outcome.second.tail()
        assert {int(note["pid"]) for note in outcome.notes} == {r.pid for r in outcome.runners}
