"""The guard inside a frozen app, like exo's EXO.app: a PyInstaller onedir binary `exo`
built from this package's wheel (tests/frozen_app/exo_standin.py). Its runner holds
the GIL in native code when the app is SIGKILLed, as a runner inside
`mx.distributed.init()` does. Guarded, it dies with the app; unguarded it lives on,
and the default scan finds it by its frozen command line.

The unguarded app and that scan (the package's CLI, frozen into the same binary) run
as another user (nobody): sweeps are machine-wide, and one run concurrently by anyone
else as root spares another user's processes, so this orphan stays until the test has
looked at it. Nobody runs a copy of the app in a directory the test makes for it: the
checkout (and the build cache in it) may sit where only its owner can enter."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exo_orphan_guard.rig.scenarios import GIL_SETTLE_SECONDS, wait_gone
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of

from .helpers.frozen import frozen_app
from .helpers.guardian import guardian

START_TIMEOUT_SECONDS = 30.0
NOBODY = 65534


@pytest.fixture(scope="module")
def app() -> Path:
    return frozen_app()


@pytest.fixture(scope="module")
def nobodys_app(app: Path) -> Generator[Path]:
    """The app, copied where user nobody can run it."""
    prefix = as_user(NOBODY)
    home = Path(tempfile.mkdtemp(prefix="eog-frozen-app-"))
    try:
        home.chmod(0o755)
        shutil.copytree(app.parent, home / app.parent.name, symlinks=True)
        copy = home / app.parent.name / app.name
        probe = subprocess.run([*prefix, "test", "-x", str(copy)], check=False)
        if probe.returncode != 0:
            pytest.skip(f"user nobody cannot run {copy}: {tempfile.gettempdir()} is private")
        yield copy
    finally:
        shutil.rmtree(home, ignore_errors=True)


@dataclass(frozen=True)
class RunningApp:
    process: subprocess.Popen[str]
    worker: ProcessIdentity
    runner: ProcessIdentity


RunApp = Callable[..., RunningApp]


def as_user(user: int | None) -> list[str]:
    """The command prefix that runs a command as `user` (none: as we are)."""
    if user is None:
        return []
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("running the app as another user needs root and setpriv")
    return [setpriv, f"--reuid={user}", f"--regid={user}", "--clear-groups"]


def _started_by(app: Path) -> list[ProcessIdentity]:
    """Every live process running the app binary (the runner's watchdog and
    multiprocessing's resource tracker included)."""
    found: list[ProcessIdentity] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/exe") == str(app):
                    identity = identity_of(int(entry))
                    if identity is not None:
                        found.append(identity)
    return found


@pytest.fixture
def run_app(app: Path) -> Generator[RunApp]:
    started: list[subprocess.Popen[str]] = []
    binaries: set[Path] = set()

    def run(*, guard: bool, user: int | None = None, binary: Path = app) -> RunningApp:
        environment = dict(os.environ)
        environment[settings.TOGGLE_ENV] = "1" if guard else "0"
        binaries.add(binary)
        process = subprocess.Popen(
            [*as_user(user), str(binary)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=environment,
            cwd="/",
        )
        started.append(process)
        assert process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        pids: dict[str, int] = {}
        while len(pids) < 2 and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            words = line.split()
            if words[0] in ("worker", "runner"):
                pids[words[0]] = int(words[1])
        assert set(pids) == {"worker", "runner"}, f"the app did not start: {pids}"
        worker, runner = identity_of(pids["worker"]), identity_of(pids["runner"])
        assert worker is not None and runner is not None
        return RunningApp(process, worker, runner)

    yield run
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()
    leftovers = [identity for binary in binaries for identity in _started_by(binary)]
    for identity in leftovers:
        if identity_of(identity.pid) == identity:
            with contextlib.suppress(ProcessLookupError):
                os.kill(identity.pid, signal.SIGKILL)
    assert not [gone for gone, at in wait_gone(leftovers, 5.0).items() if at is None]


def kill_app(running: RunningApp) -> None:
    time.sleep(GIL_SETTLE_SECONDS)  # the runner is inside its GIL-holding call
    os.kill(running.worker.pid, signal.SIGKILL)  # the worker alone, as the app is killed
    running.process.wait()


def test_the_frozen_runner_runs_as_exos_app_runners_do(run_app: RunApp, app: Path) -> None:
    running = run_app(guard=False)
    with open(f"/proc/{running.runner.pid}/cmdline", "rb") as file:
        argv = file.read().rstrip(b"\0").split(b"\0")
    assert argv[0].decode() == str(app)
    assert argv[1] == b"--multiprocessing-fork"
    assert argv[2].startswith(b"tracker_fd=") and argv[3].startswith(b"pipe_handle=")


def test_guarded_a_gil_held_frozen_runner_dies_with_the_app(run_app: RunApp) -> None:
    running = run_app(guard=True)
    kill_app(running)
    gone = wait_gone([running.runner], 10.0)[running.runner]
    assert gone is not None, "the guarded frozen runner outlived the app"


def test_unguarded_the_frozen_runner_survives_and_the_default_scan_finds_it(
    run_app: RunApp, nobodys_app: Path
) -> None:
    app = nobodys_app
    running = run_app(guard=False, user=NOBODY, binary=app)
    kill_app(running)
    assert wait_gone([running.runner], 1.0)[running.runner] is None, "no orphan to find"
    scan = subprocess.run(
        # The command line frozen into the app: it runs as nobody wherever the app does.
        [*as_user(NOBODY), str(app), "exo-orphan-guard", "scan", "--json", "--dir", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    report = json.loads(scan.stdout)
    found = {suspect["pid"]: suspect for suspect in report["suspects"]}
    assert running.runner.pid in found, report
    suspect = found[running.runner.pid]
    assert suspect["rule"] == "fingerprint"
    assert suspect["exe"] == str(app)
    assert suspect["argv"][:2] == [str(app), "--multiprocessing-fork"]
    assert scan.returncode == 1


@pytest.mark.machine_wide
def test_the_guardian_ends_an_unguarded_frozen_runner_through_python(
    run_app: RunApp, isolated_environment: Path
) -> None:
    """EXO.app, which nobody can patch: the guardian outside it sees the app's main
    process die and SIGINTs its runner, which takes it once its native call returns
    (EINTR) and exits through Python. Without the guardian it lives on (the test
    above)."""
    with guardian(isolated_environment) as running:
        app = run_app(guard=False)
        running.watching(app.worker.pid)
        stdout = app.process.stdout
        assert stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(stdout), daemon=True)
        reader.start()  # the runner holds the pipe once the app is dead
        kill_app(app)
        assert wait_gone([app.runner], 10.0)[app.runner] is not None, running.lines
        reader.join(5.0)
        assert f"runner {app.runner.pid} exited through Python\n" in lines, lines
