"""exo's own stops (EXO.app's quit, a terminal's Ctrl-C, exo's `Shutdown`), played
on exo's real worker, measured, guard off, on without the package and on with it.

`tests/exo_support/app_quit_node.py` is exo's main process around exo's real Worker
and RunnerSupervisors, with two runners that have taken their first task (exo's
`ConnectToGroup`: ranks 0 and 1 of a real ring group), the first idle, the second
busy. This side is the app (or the terminal, or exo's master): it starts that
process in a session of its own, reads each runner from outside (`/proc/<pid>/status`
signal masks, process group, session, children, threads), then

- `app`: SIGINT to its pid, 5 s, SIGTERM, 3 s, SIGKILL (`ExoProcessController.swift`),
  each only while it still runs;
- `ctrl-c`: SIGINT to its whole process group, once (what a terminal sends);
- `stop`: SIGINT to its pid, once: exo's own stop alone (`tests/helpers/exo_stop.py`);
- `shutdown`: exo's own `Shutdown` of both runners, as for an instance the master
  deleted (exo's process lives on);

and watches each runner until it is gone (or `observe` seconds): when, and how
(what exo's process saw when it reaped it, or the guardian's `ended` line, or alive).

The three configurations (`Config`): `off` (EXO_ORPHAN_GUARD unset, the package
absent, as exo's own lock builds it), `on-bare` (EXO_ORPHAN_GUARD=true, the package
absent: the in-tree module alone), `on-package` (EXO_ORPHAN_GUARD=true, the package
importable: its worker hook sweeps and starts a guardian). "Absent" is a venv of its
own with nothing of this checkout on its path (`exo_trees.exo_venv(package=False)`
checks `import exo_orphan_guard` fails there), and exo's process says so again.

    .venv/bin/python -m tests.helpers.app_quit_table --rounds 3 --out F   # inside scripts/confined
    .venv/bin/python -m tests.helpers.app_quit_table --table F

prints one line per round, and the tables of docs/exo-evidence.md from what `--out` kept.
Every process it starts carries a token in its environment (a guardian the package
starts inherits it), and all of them are killed at the end; `left_behind` names any
that outlived that.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from exo_orphan_guard import system
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of, liveness
from tests.helpers.exo_trees import REPO, SUPPORT
from tests.helpers.processes import carrying, kill_all
from tests.helpers.runner_reading import observe_runner

Scenario = Literal["app", "ctrl-c", "stop", "shutdown"]
Config = Literal["off", "on-bare", "on-package"]
CONFIGS: tuple[Config, ...] = ("off", "on-bare", "on-package")
CONFIG_LABELS: dict[Config, str] = {
    "off": "guard off",
    "on-bare": "guard on, package absent",
    "on-package": "guard on, package installed",
}
DELETE_FILE = "delete-instance"
"""In the node's scratch directory: exo's Shutdown of both runners begins."""
APP_STEPS = ((signal.SIGINT, 0.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 8.0))
TOKEN = "EOG_APP_QUIT_TOKEN"


@dataclass
class RunnerEnd:
    role: str
    pid: int
    gone_s: float | None
    """Seconds from the first signal until it was seen gone; None: alive at the end."""
    by: str
    """`exo`: it ended while exo's process lived (seen by it); `guardian`: the
    guardian's (or a sweep's) `ended` line after exo's process died; `orphaned`;
    `unknown`."""
    how: str
    step: str | None = None


@dataclass
class Round:
    version: str
    config: Config
    scenario: Scenario
    busy: str
    exo_end_s: float | None
    exo_exit: int | None
    signals: list[tuple[str, float]] = field(default_factory=list[tuple[str, float]])
    runners: dict[str, RunnerEnd] = field(default_factory=dict[str, RunnerEnd])
    keyboard_interrupts: int = 0
    """`KeyboardInterrupt` tracebacks the runners wrote (a SIGINT reached them)."""
    events: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    observed: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])
    """Each runner read from outside after its first task (`observe_runner`)."""
    package_seen: bool | None = None
    """Whether exo's process could import exo_orphan_guard (its `ready` line)."""
    guardians: list[int] = field(default_factory=list[int])
    """Guardians (`exo_orphan_guard service run`) of the round, seen once the runners
    were ready or at its end (one started by the package may have left by then)."""
    guardian_started: bool = False
    """exo's log says the package's worker hook started a guardian."""
    left_behind: list[int] = field(default_factory=list[int])
    """Processes of the round still alive after its clean-up: should be none."""

    @property
    def guard(self) -> bool:
        return self.config != "off"

    def line(self) -> str:
        ends = "; ".join(f"{r.role}: {_s(r.gone_s)} {r.by} {r.how}" for r in self.runners.values())
        return (
            f"{self.version} {self.config} {self.scenario} busy={self.busy}"
            ": "
            f"exo ended {_s(self.exo_end_s)} (exit {self.exo_exit}); {ends}; "
            f"KeyboardInterrupt tracebacks: {self.keyboard_interrupts}; "
            f"guardians: {len(self.guardians)}"
        )


def _s(value: float | None) -> str:
    return "alive" if value is None else f"{value:.2f} s"


def environment(
    scratch: Path,
    *,
    config: Config,
    eval_seconds: float,
    busy_wait: float | None,
    token: str,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXO_ORPHAN_GUARD")}
    path = [str(SUPPORT / "quit_site")]
    if config == "on-package":  # the package importable
        path_dir = scratch / "guard-path"
        path_dir.mkdir()
        (path_dir / "exo_orphan_guard").symlink_to(REPO / "exo_orphan_guard")
        path.insert(0, str(path_dir))
    (scratch / "notes").mkdir()
    env.update(
        {
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": os.pathsep.join(path),
            "EOG_STEPS_NOTES": str(scratch / "notes"),
            "EOG_STEPS_EVAL_SECONDS": str(eval_seconds),
            settings.DIR_ENV: str(scratch / "registry"),
            TOKEN: token,
        }
    )
    if config != "off":
        env[settings.TOGGLE_ENV] = "true"  # exo's own spelling
    if busy_wait is not None:
        env[settings.BUSY_WAIT_ENV] = str(busy_wait)
    return env


def run_round(
    tree: Path,
    venv: Path,
    version: str,
    *,
    config: Config,
    scenario: Scenario,
    busy: str = "eval",
    eval_seconds: float = 12.0,
    busy_wait: float | None = None,
    observe: float = 40.0,
) -> Round:
    scratch = Path(tempfile.mkdtemp(prefix="eog-app-quit-"))
    token = uuid.uuid4().hex
    log = (scratch / "exo.log").open("wb")
    exo = subprocess.Popen(
        [
            str(venv / "bin" / "python"),
            str(SUPPORT / "app_quit_node.py"),
            "--version",
            version,
            "--busy",
            busy,
            "--scratch",
            str(scratch / "node"),
        ],
        cwd=tree,
        env=environment(
            scratch,
            config=config,
            eval_seconds=eval_seconds,
            busy_wait=busy_wait,
            token=token,
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,  # it leads a process group, as exo in a terminal
    )
    result = Round(version, config, scenario, busy, None, None)
    try:
        assert exo.stdout is not None
        stdout = exo.stdout.fileno()
        os.set_blocking(stdout, False)
        buffer = b""

        def read_events() -> None:
            nonlocal buffer
            while select.select([stdout], [], [], 0)[0]:
                chunk = os.read(stdout, 65536)
                if not chunk:
                    return
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                result.events.extend(json.loads(line) for line in lines if line.strip())

        ready = _wait_ready(exo, read_events, result, scratch, busy)
        result.package_seen = ready.get("package")
        runners = {role: identity_of(pid) for role, pid in ready["pids"].items()}
        result.observed = {
            role: observe_runner(pid, exo.pid) for role, pid in ready["pids"].items()
        }
        guardians = {identity.pid for identity in _guardians(token)}
        t0, wall0 = time.monotonic(), time.time()
        pending = list(APP_STEPS) if scenario == "app" else []
        if scenario == "stop":  # exo's own stop alone: its handler's shutdown(), once
            pending = [APP_STEPS[0]]
        if scenario == "ctrl-c":
            os.killpg(exo.pid, signal.SIGINT)
            result.signals.append(("SIGINT to the group", 0.0))
        elif scenario == "shutdown":
            (scratch / "node" / DELETE_FILE).touch()
        gone: dict[str, float] = {}
        while time.monotonic() - t0 < observe:
            now = time.monotonic() - t0
            read_events()
            if result.exo_end_s is None and exo.poll() is not None:
                result.exo_end_s, result.exo_exit = now, exo.returncode
            while pending and now >= pending[0][1]:
                sig, _ = pending.pop(0)
                if exo.poll() is None:  # only while it runs: the pid is still ours
                    exo.send_signal(sig)
                    result.signals.append((signal.Signals(sig).name, round(now, 3)))
            for role, identity in runners.items():
                if role not in gone and (identity is None or liveness(identity) == "gone"):
                    gone[role] = now
            ended = result.exo_end_s is not None or scenario == "shutdown"
            if ended and len(gone) == len(runners):
                break
            time.sleep(0.02)
        # exo's process reaps a runner a moment after it is seen gone: its line may
        # still be on the way (exo's process alive: the `shutdown` scenario).
        reaped_by = time.monotonic() + 2.0
        while exo.poll() is None and time.monotonic() < reaped_by:
            read_events()
            reaped = {e["pid"] for e in result.events if e["event"] == "runner-ended"}
            if all(i is None or i.pid in reaped for r, i in runners.items() if r in gone):
                break
            time.sleep(0.02)
        read_events()
        result.keyboard_interrupts = _keyboard_interrupts(scratch)
        log.flush()
        said = (scratch / "exo.log").read_text(errors="replace")
        result.guardian_started = "orphan guard: started a guardian" in said
        for role, identity in runners.items():
            result.runners[role] = _classify(
                role, identity, gone.get(role), result, scratch / "registry", t0, wall0
            )
        guardians |= {identity.pid for identity in _guardians(token)}
        result.guardians = sorted(guardians)
        return result
    finally:
        if exo.poll() is None:
            exo.kill()
        exo.wait()
        log.close()
        kill_all(carrying(TOKEN, token))
        result.left_behind = [identity.pid for identity in carrying(TOKEN, token)]
        if os.environ.get("EOG_APP_QUIT_KEEP"):
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def _guardians(token: str) -> list[ProcessIdentity]:
    found: list[ProcessIdentity] = []
    for identity in carrying(TOKEN, token):
        with contextlib.suppress(psutil.Error):
            command = psutil.Process(identity.pid).cmdline()
            if "exo_orphan_guard" in command and "service" in command:
                found.append(identity)
    return found


def _keyboard_interrupts(scratch: Path) -> int:
    """In exo's own log (v1.0.71's runners write there) and the runners' stderr logs
    exo main keeps (`EXO_RUNNER_STDERR_LOG`, under the scratch XDG cache)."""
    logs = [scratch / "exo.log", *(scratch / "node").rglob("*.log")]
    return sum(
        log.read_text(errors="replace").count("\nKeyboardInterrupt")
        for log in logs
        if log.is_file()
    )


def _wait_ready(
    exo: subprocess.Popen[bytes], read: Any, result: Round, scratch: Path, busy: str
) -> dict[str, Any]:
    deadline = time.monotonic() + 150
    mark = {"eval": "eval begun", "decode": "decoding", "gil": "holding the gil"}[busy]
    ready: dict[str, Any] | None = None
    while time.monotonic() < deadline and exo.poll() is None:
        read()
        ready = ready or next((e for e in result.events if e["event"] == "ready"), None)
        if ready is not None:
            notes = scratch / "notes" / f"{ready['pids']['busy']}.jsonl"
            if notes.exists() and mark in notes.read_text():
                time.sleep(1.0)  # well inside it
                return ready
        time.sleep(0.05)
    tail = (scratch / "exo.log").read_text(errors="replace")[-3000:]
    raise AssertionError(f"exo's runners never got ready: {result.events} {tail}")


def _classify(
    role: str,
    identity: ProcessIdentity | None,
    gone_s: float | None,
    result: Round,
    registry: Path,
    t0: float,
    wall0: float,
) -> RunnerEnd:
    pid = identity.pid if identity else -1
    seen = next(
        (e for e in result.events if e["event"] == "runner-ended" and e["pid"] == pid), None
    )
    exiting = next((e["at"] - t0 for e in result.events if e["event"] == "exiting"), None)
    if seen is not None:
        at = seen["at"] - t0
        if seen["code"] == "exited":
            how = f"exit {seen['status']}"
        else:
            how = signal.Signals(seen["status"]).name
            if exiting is not None and at >= exiting:
                how += " (multiprocessing's atexit)"
        return RunnerEnd(role, pid, gone_s if gone_s is not None else at, "exo", how)
    ended = _ended(registry, pid) if gone_s is not None else []
    if ended:
        last = ended[-1]
        return RunnerEnd(
            role, pid, gone_s, last.by, f"{last.how} ({last.step}, {last.signal})", last.step
        )
    if gone_s is None:
        return RunnerEnd(role, pid, None, "orphaned", "alive")
    return RunnerEnd(role, pid, gone_s, "unknown", "gone")


def _ended(registry: Path, pid: int) -> list[endings.Ending]:
    """The guard's `ended` lines for `pid`: its watchdog writes one once the runner is
    gone, so allow it a moment."""
    path = host_directory(registry) / endings.ENDINGS_NAME
    deadline = time.monotonic() + 3.0
    while True:
        found = (
            [e for e in endings.read(path, system.boot_id()) if e.pid == pid and e.event == "ended"]
            if path.exists()
            else []
        )
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def exo_for(
    work: Path, version: str, config: Config, make_tree: Any, make_venv: Any, cache: Path
) -> tuple[Path, Path]:
    """The patched tree and venv for `config`: with the package, the local series on
    top of the PR and the package on the venv's path; else (guard off, or on without
    it) the PR alone, in a venv where `import exo_orphan_guard` fails."""
    package = config == "on-package"
    tree = make_tree(
        work, version, patched=True, variant="" if package else "bare", with_package=package
    )
    return tree, make_venv(tree, cache, runner=True, package=package)
