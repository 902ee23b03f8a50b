"""mlx.launch-shaped clusters: launcher SIGKILL to last rank gone, and `sweep --hosts`.

Part one starts, per trial, one launcher per variant (ranks through `exec`, through
`exec --stdin-hup`, and bare) with two idle ranks and two holding the GIL in native
code, lets them settle, and SIGKILLs the launchers one at a time in random order.
Time runs from just before the kill to the moment the last process of that kind's
ranks (rank and wrapper) is gone, seen through pidfds. Bare ranks are checked only
every tenth trial: they never go.

Part two runs `exo-orphan-guard sweep --hosts ...` end to end (starting Python, ssh,
the remote sweeps) against real sshd servers on loopback with throw-away keys (see
tests/helpers/sshd.py), for 1 and 4 hosts, interleaved with a local `sweep` and a
one-host-after-another shell loop over the same 4 hosts.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from exo_orphan_guard.rig import launch_scenario, scenarios
from exo_orphan_guard.rig.launch_scenario import LaunchedRank, RankKind, StartedLauncher
from tests.helpers import sshd

from .document import header
from .stats import Samples

DEADLINE_SECONDS = 1.0
BARE_EVERY_TRIALS = 10
KINDS: tuple[RankKind, ...] = ("idle", "idle", "gil", "gil")
VARIANTS: dict[str, list[str]] = {
    "`exec`": launch_scenario.wrapper_words(stdin_hup=False),
    "`exec --stdin-hup`": launch_scenario.wrapper_words(stdin_hup=True),
    "no wrapper": [],
}
HOST_COUNTS = (1, 4)
CLI = [sys.executable, "-m", "exo_orphan_guard"]


@dataclass
class LaunchResults:
    trials: int
    cells: dict[tuple[str, RankKind], Samples] = field(
        default_factory=dict[tuple[str, RankKind], Samples]
    )


@dataclass
class HostsResults:
    repetitions: int
    skipped: str | None = None
    cells: dict[str, Samples] = field(default_factory=dict[str, Samples])


def run_launch(trials: int, registry: Path) -> LaunchResults:
    results = LaunchResults(trials)
    for trial in range(trials):
        names = [
            name for name in VARIANTS if name != "no wrapper" or trial % BARE_EVERY_TRIALS == 0
        ]
        launchers: dict[str, StartedLauncher] = {}
        try:
            for name in names:
                launchers[name] = launch_scenario.start_launcher(
                    KINDS, wrapper=VARIANTS[name], registry=registry
                )
            time.sleep(scenarios.GIL_SETTLE_SECONDS)
            random.shuffle(names)
            for name in names:
                _measure(name, launchers[name], results)
        finally:
            for launcher in launchers.values():
                launch_scenario.cleanup(launcher)
        if (trial + 1) % 10 == 0:
            print(f"  launcher kill: {trial + 1}/{trials} trials", flush=True)
    return results


def _measure(name: str, launcher: StartedLauncher, results: LaunchResults) -> None:
    killed_at = launch_scenario.kill_launcher(launcher)
    tracked = launcher.all_processes()
    exits = scenarios.wait_gone(tracked, DEADLINE_SECONDS)
    for kind in dict.fromkeys(KINDS):
        ranks: list[LaunchedRank] = [rank for rank in launcher.ranks if rank.kind == kind]
        seen = [exits[identity] for rank in ranks for identity in rank.tree]
        last = None if any(when is None for when in seen) else max(w for w in seen if w)
        cell = results.cells.setdefault((name, kind), Samples())
        cell.add(None if last is None else (last - killed_at) * 1000)


def render_launch(results: LaunchResults) -> str:
    lines = [
        "| wrapper | ranks | launchers killed | all gone | p50 ms | p99 ms | max ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (name, kind), samples in sorted(
        results.cells.items(), key=lambda item: (list(VARIANTS).index(item[0][0]), item[0][1])
    ):
        label = "2 idle" if kind == "idle" else "2 holding the GIL in native code"
        lines.append(
            f"| {name} | {label} | {samples.count} | {samples.exited} | "
            f"{samples.quantile_text(0.5, DEADLINE_SECONDS)} | "
            f"{samples.quantile_text(0.99, DEADLINE_SECONDS)} | "
            f"{samples.quantile_text(1.0, DEADLINE_SECONDS)} |"
        )
    return "\n".join(lines)


def run_hosts(repetitions: int, scratch: Path) -> HostsResults:
    results = HostsResults(repetitions)
    reason = sshd.why_sshd_cannot_run()
    if reason is not None:
        results.skipped = reason
        return results
    installed = scratch / "installed-bin"
    installed.mkdir()
    (installed / "exo-orphan-guard").symlink_to(Path(sys.executable).parent / "exo-orphan-guard")
    registry = scratch / "registry"
    environment = {"PATH": f"{installed}:/usr/bin:/bin", "EXO_ORPHAN_GUARD_DIR": str(registry)}
    aliases = [f"eog-{index}" for index in range(1, max(HOST_COUNTS) + 1)]
    cluster = sshd.start_loopback_sshd(scratch / "ssh", dict.fromkeys(aliases, environment))
    try:
        token = f"eog-bench-{uuid.uuid4().hex}"
        query = ["--registry-only", "--match", token, "--any-parent", "--json"]
        env = dict(
            os.environ,
            EXO_ORPHAN_GUARD_SSH_COMMAND=cluster.ssh_command,
            EXO_ORPHAN_GUARD_DIR=str(registry),
        )
        loop = " ; ".join(
            f"{cluster.ssh_command} -o BatchMode=yes {alias} exo-orphan-guard sweep "
            f"{' '.join(query)} >/dev/null"
            for alias in aliases
        )
        commands: dict[str, list[str]] = {
            "`sweep` here, no ssh": [*CLI, "sweep", *query],
            **{
                f"`sweep --hosts`, {count} host(s)": [
                    *CLI,
                    "sweep",
                    "--hosts",
                    ",".join(aliases[:count]),
                    *query,
                ]
                for count in HOST_COUNTS
            },
            f"shell loop: `ssh HOST exo-orphan-guard sweep` x {len(aliases)}": [
                "/bin/sh",
                "-c",
                loop,
            ],
        }
        for repetition in range(repetitions):
            order = list(commands.items())
            random.shuffle(order)
            for name, argv in order:
                started = time.monotonic()
                completed = subprocess.run(argv, env=env, capture_output=True, check=False)
                elapsed = (time.monotonic() - started) * 1000
                ok = completed.returncode == 0
                results.cells.setdefault(name, Samples()).add(elapsed if ok else None)
            if (repetition + 1) % 5 == 0:
                print(f"  sweep --hosts: {repetition + 1}/{repetitions}", flush=True)
    finally:
        cluster.stop()
    return results


def _row_order(name: str) -> tuple[bool, bool, str]:
    return ("loop" in name, "--hosts" in name, name)


def render_hosts(results: HostsResults) -> str:
    if results.skipped is not None:
        return f"Skipped: {results.skipped}."
    lines = ["| command | runs | ok | median ms | p99 ms |", "|---|---:|---:|---:|---:|"]
    for name, samples in sorted(results.cells.items(), key=lambda item: _row_order(item[0])):
        lines.append(
            f"| {name} | {samples.count} | {samples.exited} | "
            f"{samples.quantile_text(0.5, 0)} | {samples.quantile_text(0.99, 0)} |"
        )
    return "\n".join(lines)


def section(arguments: argparse.Namespace, scratch: Path) -> str:
    trials: int = arguments.launch_trials
    repetitions: int = arguments.hosts_repetitions
    alone = ""
    if arguments.only.replace(" ", "") == "launch":
        alone = "Run alone (`--only launch`), not within a full `make bench`. "
    launch = run_launch(trials, scratch / "registry")
    hosts = run_hosts(repetitions, scratch)
    return "\n".join(
        [
            header(
                "mlx.launch-shaped clusters: launcher SIGKILL, and `sweep --hosts`",
                f"python -m bench.run_all --only launch --launch-trials {trials} "
                f"--hosts-repetitions {repetitions}",
            ),
            f"{alone}{trials} trials. In each, one launcher per wrapper variant starts its "
            "ranks the way `mlx.launch` starts local ones (`bash -c 'exec CMD'`, stdin a "
            "pipe from the launcher): 2 idle and 2 holding the GIL in "
            "`ctypes.PyDLL(None).sleep()`. The launchers are SIGKILLed one at a time in random "
            "order; time runs from just before the kill until the last of those ranks (rank "
            "and wrapper processes) is gone, seen through pidfds. Bare ranks are tried every "
            f"{BARE_EVERY_TRIALS}th trial only.\n",
            render_launch(launch),
            "",
            f"`sweep --hosts` end to end (Python start-up, ssh connections, the remote "
            f"sweeps; `--registry-only --match TOKEN --any-parent --json`, nothing to kill), "
            f"{repetitions} runs per row, rows interleaved in random order. The hosts are "
            "real `sshd` servers on 127.0.0.1 (one per host, throw-away keys, "
            "`tests/helpers/sshd.py`), so the ssh handshakes are real and the network is "
            f'not; all 4 "hosts" share this machine\'s {os.cpu_count()} cores, so 4 hosts '
            "cost more than 1 here where real hosts would not. The shell loop visits the "
            "same 4 hosts one after another.\n",
            render_hosts(hosts),
            "",
        ]
    )
