"""A real `mlx.launch` group (ring backend, two 127.0.0.1 ranks) through `exec`.

The documented form, `mlx.launch ... -- exo-orphan-guard exec --stdin-hup -- python3
rank.py`, forms its group; when `mlx.launch` is SIGKILLed mid-run no rank is left.
Without the wrapper the same kill leaves both ranks running (the control).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

import pytest

from exo_orphan_guard.rig import ring_ports, ring_scenario, scenarios
from exo_orphan_guard.rig.json_lines import JsonLines
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of

MLX_LAUNCH = Path(sys.executable).parent / "mlx.launch"
FORM_TIMEOUT_SECONDS = 60.0

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="mlx[cpu] ring backend on Linux"),
    pytest.mark.skipif(
        not ring_scenario.mlx_available() or not MLX_LAUNCH.exists(),
        reason="needs mlx[cpu] and its mlx.launch (a test dependency on Linux)",
    ),
]

# Rank 0 idles in Python; rank 1 holds the GIL in native code, as a rank in MLX would.
RANK_SCRIPT = """
import ctypes, json, os, time
import mlx.core as mx
group = mx.distributed.init(backend="ring", strict=True)
total = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]), group=group)
mx.eval(total)
report = {"rank": group.rank(), "pid": os.getpid(), "ppid": os.getppid(), "sum": total.item()}
print(json.dumps(report), flush=True)
if group.rank() == 1:
    ctypes.PyDLL(None).sleep(3600)
time.sleep(3600)
"""


@dataclass
class Launched:
    process: subprocess.Popen[bytes]
    reports: dict[int, dict[str, float]] = field(default_factory=dict[int, dict[str, float]])
    tracked: list[ProcessIdentity] = field(default_factory=list[ProcessIdentity])


def free_port_pair() -> int:
    """A port P with P and P+1 free on loopback (mlx.launch gives rank i port P+i)."""
    for _ in range(100):
        port = ring_ports.free_loopback_ports(1)[0]
        sockets: list[socket.socket] = []
        try:
            for candidate in (port, port + 1):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", candidate))
            return port
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no two adjacent free ports on loopback")


@pytest.fixture
def launches() -> Iterator[list[Launched]]:
    started: list[Launched] = []
    yield started
    for launched in started:
        if launched.process.poll() is None:
            launched.process.kill()
            launched.process.wait()
        for identity in scenarios.alive(launched.tracked):
            with contextlib.suppress(ProcessLookupError):
                os.kill(identity.pid, signal.SIGKILL)
        scenarios.wait_gone(launched.tracked, 5.0)


def launch(tmp_path: Path, wrapper: list[str], launches: list[Launched]) -> Launched:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, TMPDIR=str(tmp_path))  # mlx.launch's pid and host files
    process = subprocess.Popen(
        [
            str(MLX_LAUNCH),
            "--hosts",
            "127.0.0.1,127.0.0.1",
            "--backend",
            "ring",
            "--starting-port",
            str(free_port_pair()),
            "--",
            *wrapper,
            sys.executable,
            str(script),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    launched = Launched(process)
    launches.append(launched)
    assert process.stdout is not None
    launched.reports.update(
        rank_reports(process.stdout, launched.tracked, FORM_TIMEOUT_SECONDS, parents=bool(wrapper))
    )
    return launched


def rank_reports(
    stdout: IO[bytes], tracked: list[ProcessIdentity], timeout: float, *, parents: bool
) -> dict[int, dict[str, float]]:
    """Each rank's line once the group formed (a launcher's other lines skipped); each
    rank, and with `parents` its parent (its wrapper), tracked."""
    lines = JsonLines(stdout)
    reports: dict[int, dict[str, float]] = {}
    deadline = time.monotonic() + timeout
    while len(reports) < 2:
        try:
            document = lines.next(max(0.0, deadline - time.monotonic()))
        except ValueError:
            continue
        assert document is not None, "the group did not form"
        if not isinstance(document, dict) or "rank" not in document:
            continue
        report = cast(dict[str, float], document)
        reports[int(report["rank"])] = report
        for pid in (report["pid"], report["ppid"]) if parents else (report["pid"],):
            identity = identity_of(int(pid))
            assert identity is not None
            tracked.append(identity)
    return reports


def test_wrapped_ranks_form_the_group_and_die_with_mlx_launch_unwrapped_ones_outlive_it(
    tmp_path: Path, launches: list[Launched]
) -> None:
    (tmp_path / "control").mkdir()
    (tmp_path / "wrapped").mkdir()
    control = launch(tmp_path / "control", [], launches)
    assert {rank: report["sum"] for rank, report in control.reports.items()} == {0: 3.0, 1: 3.0}
    wrapper = [sys.executable, "-m", "exo_orphan_guard", "exec", "--stdin-hup", "--"]
    launched = launch(tmp_path / "wrapped", wrapper, launches)
    assert {rank: report["sum"] for rank, report in launched.reports.items()} == {0: 3.0, 1: 3.0}
    # Each rank's parent is its wrapper, whose parent is mlx.launch itself.
    for report in launched.reports.values():
        with open(f"/proc/{int(report['ppid'])}/stat") as stat:
            assert int(stat.read().rsplit(")", 1)[1].split()[1]) == launched.process.pid
    time.sleep(scenarios.GIL_SETTLE_SECONDS)
    for started in (control, launched):
        os.kill(started.process.pid, signal.SIGKILL)
        started.process.wait()
    exits = scenarios.wait_gone(launched.tracked, 5.0)
    assert all(seen is not None for seen in exits.values()), "a rank outlived mlx.launch"
    # The control, killed first: without the wrapper its ranks outlived that wait.
    assert scenarios.alive(control.tracked) == control.tracked
