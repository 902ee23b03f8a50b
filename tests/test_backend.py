"""EXO_ORPHAN_GUARD_BACKEND: the portable backend really leaves Linux's mechanisms alone."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.process_facts import ProcessDetails, ProcessState
from tests.conftest import StartWorker
from tests.helpers.waiting import wait_until

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
    the engine then waits for what SIGKILL left as for one on its way out."""
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


EXEC_ON_LINE = (
    "import os, sys\n"
    "sys.stdin.readline()\n"
    "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)'])\n"
)


def test_a_process_state_agrees_with_its_details_and_its_image_changes_at_exec() -> None:
    """What the guardian's scans read afresh (`process_state`) is what the full reads
    say, and its image stays the same from read to read until the process execs, even
    into the same interpreter (the scans' memo keeps what it read under that image)."""
    process = subprocess.Popen([sys.executable, "-c", EXEC_ON_LINE], stdin=subprocess.PIPE)
    try:
        read: list[tuple[ProcessState | None, ProcessDetails | None]] = []

        def waiting_for_its_line() -> bool:
            read[:] = [(system.process_state(process.pid), system.process_details(process.pid))]
            state, details = read[0]
            if state is None or details is None or state.image is None:
                return False  # still starting: not the script's image yet
            # Blocked in its read, it stays so. Just after its exec the kernel's RSS
            # counters may still read 0: they are folded in from per-CPU deltas.
            return EXEC_ON_LINE in (details.argv or ()) and (
                state.status == details.status == "sleeping"
            )

        assert wait_until(waiting_for_its_line, 10)
        state, details = read[0]
        assert state is not None and details is not None
        assert state.start == system.read_start(process.pid)
        assert (state.ppid, state.pgid) == (details.ppid, details.pgid)
        assert state.rss is not None and state.rss > 0
        assert state.memory is not None and state.memory.bytes > 0
        again = system.process_state(process.pid)
        assert state.image is not None and again is not None and again.image == state.image
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        process.stdin.flush()

        def exec_ed() -> bool:  # the new program's command line, its image complete
            line = system.command_line(process.pid) or b""
            return b"time.sleep(60)" in line and b"readline" not in line

        assert wait_until(exec_ed, 10)
        after = system.process_state(process.pid)
        assert after is not None and after.start == state.start
        assert after.image is not None and after.image != state.image
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("disposition", ["SIG_IGN", "SIG_DFL"])
def test_a_process_state_says_whether_sigint_is_ignored_as_its_status_does(
    disposition: str,
) -> None:
    script = (
        f"import signal, sys; signal.signal(signal.SIGINT, signal.{disposition})\n"
        "print('set', flush=True); sys.stdin.readline()\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"set\n"
        state = system.process_state(process.pid)
        assert state is not None
        told = system.ignores_signal(process.pid, signal.SIGINT)
        assert state.ignores_sigint is told
        if system.BACKEND == "linux":
            assert told is (disposition == "SIG_IGN")
    finally:
        process.kill()
        process.wait()


def test_every_call_about_a_gone_process_answers_without_raising() -> None:
    """The error contract (`system`'s docstring): what cannot be told is None, a list
    holds what could be read, and nothing raises for a process that is gone."""
    gone = 2**22 + 1  # above any pid_max: never a process
    answers = {
        "read_start": system.read_start(gone),
        "parent_pid": system.parent_pid(gone),
        "process_details": system.process_details(gone),
        "process_state": system.process_state(gone),
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
