"""Real processes for sweep tests: fake exo environments, orphans, other users."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import psutil

from exo_orphan_guard import system
from exo_orphan_guard.rig.scenarios import wait_gone
from exo_orphan_guard.rig.stand_in_exo import make_exo_environment
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of

NOBODY = 65534


def make_fake_exo_environment(root: Path) -> str:
    """A venv whose site-packages holds exo's dist-info and a stand-in of exo's Rust
    extension (and can import this project): the stand-in workers run from it show
    what exo's main process and its console script's runners show; anything else run
    from it shows nothing of exo's, as in exo's own environment."""
    return make_exo_environment(root)


def start_orphan(argv: Sequence[str], *, user: int | None = None) -> ProcessIdentity:
    """Start `argv` detached from us (its parent exits at once, so init adopts it)."""
    prefix: list[str] = []
    if user is not None:
        prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"]
    command = " ".join(_quote(word) for word in [*prefix, *argv])
    shell = subprocess.run(
        ["/bin/sh", "-c", f"{command} </dev/null >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    # Seen once (2026-12-04, a fresh clone's make test at load 4): no pid, exit 0, and
    # the orphan running. Say all the shell said, should it come again.
    assert shell.stdout.strip().isdigit(), (
        f"no pid from the shell that started {argv}: stdout {shell.stdout!r}, "
        f"stderr {shell.stderr!r}, exit {shell.returncode}"
    )
    pid = int(shell.stdout.strip())
    deadline = time.monotonic() + 5.0
    # setpriv (or the shell) execs the real command a moment later: wait for it. Until
    # then the background shell shows the outer shell's command line (and user), whose
    # first word may be the command's own (/bin/sh): only the whole argv says.
    while not _has_exec_ed(pid, argv):
        assert time.monotonic() < deadline, f"{argv} did not start"
        time.sleep(0.01)
    identity = identity_of(pid)
    assert identity is not None
    return identity


def started_child(parent: ProcessIdentity, word: str) -> ProcessIdentity:
    """The child of `parent` whose command line holds `word`, once it has exec'd.

    Between fork and exec a child shows its parent's command line, so the first child
    listed may not match any rule yet (seen in CI, 2026-12-05): wait for the exec."""
    deadline = time.monotonic() + 10.0
    while True:
        for child in psutil.Process(parent.pid).children():
            with contextlib.suppress(psutil.Error):
                if word in child.cmdline() and (identity := identity_of(child.pid)):
                    return identity
        assert time.monotonic() < deadline, f"no child of {parent.pid} runs {word!r}"
        time.sleep(0.01)


def _has_exec_ed(pid: int, argv: Sequence[str]) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().split(b"\0")[:-1] == [os.fsencode(word) for word in argv]
    except OSError:
        return False


def kill_all(identities: Sequence[ProcessIdentity]) -> None:
    """Kill each process and everything it started (a shell's `sleep`, say)."""
    family = list(identities)
    for identity in identities:
        if identity_of(identity.pid) == identity:
            family.extend(
                child
                for pid in system.descendants(identity.pid)
                if (child := identity_of(pid)) is not None
            )
    for identity in family:
        if identity_of(identity.pid) == identity:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(identity.pid, signal.SIGKILL)
    wait_gone(family, 5.0)


def gone_within(processes: Sequence[ProcessIdentity], seconds: float) -> bool:
    return all(seen is not None for seen in wait_gone(list(processes), seconds).values())


def describe(pids: Sequence[int]) -> list[str]:
    """Who each still-running process is: its state, where in the kernel it waits, its
    threads, parent and command line."""
    described: list[str] = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                described.append(
                    f"{pid} {process.status()} wchan={_wchan(pid)} "
                    f"threads={process.num_threads()} ppid={process.ppid()} "
                    f"{process.cmdline()}"
                )
        except psutil.Error:
            described.append(f"{pid} (gone meanwhile)")
    return described


def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text() or "-"
    except OSError:
        return "?"


def signal_masks(pids: Sequence[int]) -> dict[int, str]:
    """Blocked, ignored, caught and pending signals of each (Linux /proc), in hex."""
    masks: dict[int, str] = {}
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError as error:
            masks[pid] = error.strerror or "unreadable"
            continue
        keys = ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        masks[pid] = " ".join(line for line in lines if line.split(":")[0] in keys)
    return masks


def _quote(word: str) -> str:
    return shlex.quote(word)


def carrying(variable: str, value: str) -> list[ProcessIdentity]:
    """Every live process whose environment has `variable=value` (Linux)."""
    needle = f"{variable}={value}".encode()
    found: list[ProcessIdentity] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as file:
                if needle not in file.read().split(b"\0"):
                    continue
        except OSError:
            continue
        if (identity := identity_of(int(name))) is not None:
            found.append(identity)
    return found


def sleeper(token: str) -> list[str]:
    """A process that sleeps with `token` in its command line."""
    return [sys.executable, "-c", "import time; time.sleep(600)", token]


def start_deaf_orphan(token: str, scratch: Path) -> ProcessIdentity:
    """An orphan `sleeper` that outlives SIGTERM (only SIGKILL ends it), returned once
    it ignores it."""
    ready = scratch / f"deaf-{uuid.uuid4().hex}"
    code = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(600)"
    )
    orphan = start_orphan([sys.executable, "-c", code, str(ready), token])
    deadline = time.monotonic() + 10.0
    while not ready.exists():
        assert time.monotonic() < deadline, "the deaf orphan never got ready"
        time.sleep(0.01)
    return orphan
