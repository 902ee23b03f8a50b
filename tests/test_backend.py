"""EXO_ORPHAN_GUARD_BACKEND: the portable backend really leaves Linux's mechanisms alone."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.system import settings
from tests.conftest import StartWorker

PROBE = """
import json, signal
from exo_orphan_guard import system
from exo_orphan_guard.watch import waiters
from exo_orphan_guard.system.identity import current_identity
print(json.dumps({
    "backend": system.BACKEND,
    "pidfd": waiters.can_use_pidfd(),
    "waiters": waiters.usable_waiters(current_identity()),
    "pdeathsig": system.set_parent_death_signal(signal.SIGKILL),
    "subreaper": system.become_child_subreaper(),
    "forked_by_main_thread": system.forked_by_main_thread(1, 2),
}))
"""


def probe(value: str | None) -> tuple[dict[str, object], str]:
    env = dict(os.environ)
    env.pop(settings.BACKEND_ENV, None)
    if value is not None:
        env[settings.BACKEND_ENV] = value
    completed = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    facts: dict[str, object] = json.loads(completed.stdout)
    return facts, completed.stderr


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, "auto"), ("", "auto"), ("auto", "auto"), (" Portable ", "portable")],
)
def test_backend_words(raw: str | None, expected: str) -> None:
    assert settings.parse_backend(raw) == settings.Parsed(expected)


def test_an_odd_backend_value_warns_and_picks_auto() -> None:
    parsed = settings.parse_backend("macos")
    assert parsed.value == "auto" and parsed.warning is not None and "'macos'" in parsed.warning


def test_portable_uses_no_linux_mechanism() -> None:
    facts, _ = probe("portable")
    assert facts == {
        "backend": "portable",
        "pidfd": False,
        "waiters": ["poll"],
        "pdeathsig": False,
        "subreaper": False,
        "forked_by_main_thread": None,
    }


@pytest.mark.skipif(sys.platform != "linux", reason="auto picks the Linux backend on Linux")
def test_auto_on_linux_is_the_linux_backend() -> None:
    facts, _ = probe(None)
    assert facts["backend"] == "linux" and facts["pidfd"] is True


def test_a_bad_value_warns_once_and_runs_auto() -> None:
    facts, stderr = probe("bogus")
    assert facts["backend"] == ("linux" if sys.platform == "linux" else "portable")
    assert stderr.count("EXO_ORPHAN_GUARD_BACKEND='bogus'") == 1, stderr


def _pidfds(pid: int) -> int:
    count = 0
    for entry in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{entry}") == "anon_inode:[pidfd]"
        except OSError:
            continue
    return count


@pytest.mark.skipif(sys.platform != "linux", reason="inspects the runner through /proc")
def test_guarded_runners_watch_with_the_backend_of_their_environment(
    start_worker: StartWorker,
) -> None:
    """The variable passes from the worker to its runners and their watchdogs."""
    worker = start_worker(["idle"])
    runner = worker.runners[0]
    watchdog = runner.watchdog
    watching = _pidfds(runner.identity.pid) + _pidfds(watchdog.pid)
    assert (watching > 0) == (system.BACKEND == "linux"), (system.BACKEND, watching)


def test_portable_closes_inherited_files_from_the_fd_listing() -> None:
    script = """
import os, sys
from exo_orphan_guard import system
kept = os.open(os.devnull, os.O_RDONLY)
for _ in range(20):
    os.open(os.devnull, os.O_RDONLY)
os.dup2(kept, 200)
system.close_inherited_files(3)
print(system.BACKEND, sorted(int(fd) for fd in os.listdir("/dev/fd")))
"""
    for backend in ("auto", "portable"):
        env = {**os.environ, settings.BACKEND_ENV: backend}
        completed = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        # What is left: stdio, and the listing's own fd.
        name, fds = completed.stdout.split(" ", 1)
        assert json.loads(fds) == [0, 1, 2, 3], (name, fds)


@pytest.mark.parametrize("platform", ["linux", "darwin", "portable"])
def test_every_backend_answers_every_call_as_declared(platform: str) -> None:
    """`system` names each call once; each backend's chain must answer all of them, and
    take the declared parameters (a module may add its own, with defaults, for tests)."""
    from exo_orphan_guard.system import _darwin, _linux, _posix, backend

    chain = {"linux": (_linux, _posix), "darwin": (_darwin, _posix), "portable": (_posix,)}
    for name, declared in system.interface().items():
        found = backend.implementation(name, chain[platform])
        wanted = list(inspect.signature(declared).parameters)
        parameters = list(inspect.signature(found).parameters.values())
        assert [parameter.name for parameter in parameters[: len(wanted)]] == wanted, name
        extra = parameters[len(wanted) :]
        assert all(parameter.default is not inspect.Parameter.empty for parameter in extra), name


def test_a_running_process_is_not_exiting() -> None:
    """Linux reads a pending SIGKILL, macOS `ps`; psutil alone cannot tell (None), and
    the engine then reports what SIGKILL left as unkillable at the kill wait."""
    told = system.BACKEND == "linux" or sys.platform == "darwin"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert system.is_exiting(sleeper.pid) is (False if told else None)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_psutil_status_words_are_the_snapshots() -> None:
    import psutil

    from exo_orphan_guard.system import process_facts

    assert (process_facts.ZOMBIE, process_facts.DEAD) == (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def test_every_call_about_a_gone_process_answers_without_raising() -> None:
    """The error contract (`system`'s docstring): what cannot be told is None, a list
    holds what could be read, and nothing raises for a process that is gone."""
    gone = 2**22 + 1  # above any pid_max: never a process
    answers = {
        "read_start": system.read_start(gone),
        "parent_pid": system.parent_pid(gone),
        "process_details": system.process_details(gone),
        "effective_uid": system.effective_uid(gone),
        "owner_and_argv": system.owner_and_argv(gone),
        "exe_and_argv": system.exe_and_argv(gone),
        "thread_count": system.thread_count(gone),
        "stuck_state": system.stuck_state(gone),
        "is_stopped": system.is_stopped(gone),
        "is_exiting": system.is_exiting(gone),
        "memory_usage": system.memory_usage(gone),
        "pipe_inodes": system.pipe_inodes(gone),
        "mapped_files": system.mapped_files(gone),
        "process_group": system.process_group(gone),
        "child_pids": system.child_pids(gone),
        "descendants": system.descendants(gone),
        "group_members": system.group_members([gone]),
    }
    assert answers == {
        name: [] if name in ("child_pids", "descendants", "group_members") else None
        for name in answers
    }
    if system.BACKEND == "linux":
        assert system.environment_value(gone, "PATH") is None
    else:  # another process's environment is never readable here: it may be set
        with pytest.raises(PermissionError):
            system.environment_value(gone, "PATH")
