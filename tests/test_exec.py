"""`exo-orphan-guard exec` on real processes: the command dies with a SIGKILLed wrapper
or its parent, signals are forwarded and escalated, exit codes and stdio pass through,
`--stdin-hup` fires. Under a stand-in `mlx.launch`: `test_exec_launcher.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_orphan_guard.records.registry import host_directory
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from exo_orphan_guard.watch.exec_wrapper import exit_status, parse_command
from tests.helpers.cli import CLI
from tests.helpers.processes import describe, gone_within, kill_all, signal_masks
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and uses pidfds")

WRAPPER = [*CLI, "exec"]
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GONE_WITHIN_SECONDS = 10.0
"""For the command's tree once the wrapper stops or dies: met at once when it works
(how soon is `make bench`'s launch section)."""
# A child that reports its pid and those of its own child, then waits.
PYTHON_WITH_CHILD = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen(['sleep', '3600'])\n"
    "print(os.getpid(), child.pid, flush=True)\n"
    "time.sleep(3600)\n"
)
# Reports the signal it gets, then waits on the wake-up fd, not in `time.sleep()`: a
# signal handled just before the sleep's clock_nanosleep (the wrapper forwards it as
# soon as the pid is out) sets only CPython's flag, and the sleep never ends (seen once
# in `make test`; 1 run in 300-1000 of a bare sleep here, state S, nothing pending).
# The fd is written by the C handler whenever the signal came: select returns at once.
TERM_REPORTER = (
    "import os, select, signal, sys\n"
    "def on(number, frame):\n"
    "    print(signal.Signals(number).name, flush=True)\n"
    "    sys.exit(3)\n"
    "for name in ('SIGTERM', 'SIGINT', 'SIGHUP'):\n"
    "    signal.signal(getattr(signal, name), on)\n"
    "wake, woken = os.pipe()\n"
    "os.set_blocking(woken, False)\n"
    "signal.set_wakeup_fd(woken)\n"
    "print(os.getpid(), flush=True)\n"
    "while True:\n"
    "    select.select([wake], [], [])\n"
    "    os.read(wake, 512)\n"
)


@pytest.fixture
def wrapped() -> Iterator[list[subprocess.Popen[str]]]:
    """Wrappers started by a test; killed with whatever they report at teardown."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def _ignore(ignoring: signal.Signals | None) -> None:
    for number in FORWARDED:
        signal.signal(number, signal.SIG_IGN if number == ignoring else signal.SIG_DFL)


def start_wrapped(
    started: list[subprocess.Popen[str]],
    *options: str,
    code: str,
    ignoring: signal.Signals | None = None,
) -> tuple[subprocess.Popen[str], list[ProcessIdentity]]:
    """`exec OPTIONS -- python -c CODE`, and the pids the code printed first.

    The wrapper starts with default dispositions for the forwarded signals, or with
    `ignoring` ignored (as under nohup), whatever this test process inherited."""
    process = subprocess.Popen(
        [*WRAPPER, *options, "--", sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: _ignore(ignoring),
    )
    started.append(process)
    assert process.stdout is not None
    line = process.stdout.readline()
    identities = [identity_of(int(word)) for word in line.split()]
    assert identities and all(identity is not None for identity in identities), line
    # The wrapper starts the command first, then arms its watch and writes its record:
    # the command's pids say nothing of the watch.
    record = host_directory(settings.registry_dir()) / f"runner-{process.pid}.json"
    assert wait_until(record.exists, 10.0), f"wrapper {process.pid} never armed its watch"
    return process, [identity for identity in identities if identity is not None]


# --- pure parts ----------------------------------------------------------------------


def test_exit_status_is_the_shells() -> None:
    assert exit_status(0) == 0
    assert exit_status(7) == 7
    assert exit_status(-signal.SIGTERM) == 143
    assert exit_status(-signal.SIGKILL) == 137


def test_parse_command_drops_the_separator_and_needs_a_command() -> None:
    assert parse_command(["--", "python3", "-c", "--"]) == ("python3", "-c", "--")
    assert parse_command(["python3"]) == ("python3",)
    with pytest.raises(ValueError, match="needs a command"):
        parse_command(["--"])


def test_command_never_outlives_a_sigkilled_wrapper(
    wrapped: list[subprocess.Popen[str]],
) -> None:
    """The wrapper's watchdog sees it die and kills its process group: the command
    and what the command started (on Linux PR_SET_PDEATHSIG takes the command first)."""
    process, (child, grandchild) = start_wrapped(wrapped, code=PYTHON_WITH_CHILD)
    process.kill()
    process.wait()
    try:
        assert gone_within([child, grandchild], GONE_WITHIN_SECONDS)
    finally:
        kill_all([child, grandchild])


# --- signals ---------------------------------------------------------------------------


# The command's SIGCHLD comes just after the wrapper's poll saw it running: a real
# SIGCHLD, sent from inside the first poll, reaches the real signal inbox.
EXIT_DURING_THE_FIRST_POLL = """
import os, signal
from exo_orphan_guard.watch import exec_wrapper

class ExitsDuringTheFirstPoll:
    pid = os.getpid()
    returncode = None
    polls = 0

    def poll(self):
        self.polls += 1
        if self.polls > 1:
            self.returncode = 0
        else:
            os.kill(os.getpid(), signal.SIGCHLD)
        return self.returncode

inbox = exec_wrapper._SignalInbox()
options = exec_wrapper.ExecOptions(("true",))
print(exec_wrapper._Supervisor(ExitsDuringTheFirstPoll(), None, options, inbox).run())
"""


def test_an_exit_between_the_poll_and_the_signal_pipe_still_wakes_the_wrapper() -> None:
    """Read the other way round (poll, then drain), the drain takes the exit's wake-up
    byte and the wrapper sleeps until its deadline: with none set, for ever."""
    finished = subprocess.run(
        [sys.executable, "-c", EXIT_DURING_THE_FIRST_POLL],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert (finished.returncode, finished.stdout.strip()) == (0, "0"), finished.stderr


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded_and_the_exit_status_passes_through(
    wrapped: list[subprocess.Popen[str]], number: signal.Signals
) -> None:
    process, (command,) = start_wrapped(wrapped, code=TERM_REPORTER)
    process.send_signal(number)
    try:
        out, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(
            f"the wrapper did not exit: {describe([process.pid, command.pid])}, "
            f"{signal_masks([process.pid, command.pid])}, stdout {expired.stdout!r}, "
            f"stderr {expired.stderr!r}"
        )
    assert out.strip() == number.name
    assert process.returncode == 3


def test_a_signal_ignored_when_the_wrapper_starts_stays_ignored(
    wrapped: list[subprocess.Popen[str]],
) -> None:
    # Under nohup: neither the wrapper nor the command acts on SIGHUP.
    code = "import signal\nsignal.signal(signal.SIGHUP, signal.SIG_DFL)\n" + PYTHON_WITH_CHILD
    process, tree = start_wrapped(wrapped, code=code, ignoring=signal.SIGHUP)
    process.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    assert process.poll() is None and scenarios.alive(tree) == tree
    process.terminate()
    assert process.wait(timeout=10) == 128 + signal.SIGTERM
    assert gone_within(tree, GONE_WITHIN_SECONDS)


def test_a_command_deaf_to_sigterm_is_killed_with_its_tree_after_the_grace(
    wrapped: list[subprocess.Popen[str]],
) -> None:
    code = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + PYTHON_WITH_CHILD
    process, tree = start_wrapped(wrapped, "--grace", "0.5", code=code)
    sent_at = time.monotonic()
    process.terminate()
    process.wait(timeout=10)
    waited = time.monotonic() - sent_at
    assert process.returncode == 128 + signal.SIGKILL
    assert 0.4 < waited < 3.0
    assert gone_within(tree, GONE_WITHIN_SECONDS)
    assert "SIGKILL in 0.5 s" in (process.stderr.read() if process.stderr else "")


def test_a_command_killed_by_a_signal_exits_128_plus_n() -> None:
    code = "import os, signal\nos.kill(os.getpid(), signal.SIGUSR1)\n"
    completed = subprocess.run(
        [*WRAPPER, "--", sys.executable, "-c", code], timeout=30, check=False
    )
    assert completed.returncode == 128 + signal.SIGUSR1


# --- stdio and exit codes --------------------------------------------------------------


def test_stdio_and_exit_code_pass_through() -> None:
    code = (
        "import sys\n"
        "data = sys.stdin.read()\n"
        "print(data.upper())\n"
        "print('err', file=sys.stderr)\n"
        "sys.exit(7)\n"
    )
    completed = subprocess.run(
        [*WRAPPER, "--", sys.executable, "-c", code],
        input="hello rank",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (completed.returncode, completed.stdout, completed.stderr) == (
        7,
        "HELLO RANK\n",
        "err\n",
    )


@pytest.mark.parametrize(
    ("command", "status", "message"),
    [
        (["/nonexistent/rank"], 127, "command not found"),
        (["/dev/null"], 126, "Permission denied"),
    ],
)
def test_a_command_that_cannot_run_gets_the_shells_status(
    command: list[str], status: int, message: str
) -> None:
    completed = subprocess.run(
        [*WRAPPER, "--", *command], capture_output=True, text=True, timeout=30, check=False
    )
    assert completed.returncode == status
    assert message in completed.stderr and completed.stderr.count("\n") == 1


def test_no_command_is_a_usage_error() -> None:
    completed = subprocess.run(
        [*WRAPPER, "--"], capture_output=True, text=True, timeout=30, check=False
    )
    assert completed.returncode == 2
    assert completed.stderr.startswith("exo-orphan-guard: error: exec needs a command")


# --- --stdin-hup -----------------------------------------------------------------------


def test_stdin_hup_stops_the_command_when_the_pipe_closes_while_the_parent_lives(
    wrapped: list[subprocess.Popen[str]],
) -> None:
    process, tree = start_wrapped(wrapped, "--stdin-hup", code=PYTHON_WITH_CHILD)
    assert process.stdin is not None
    process.stdin.write("ignored by the wrapper\n")
    process.stdin.flush()
    time.sleep(0.2)
    assert scenarios.alive(tree) == tree, "data on stdin is not a hang-up"
    process.stdin.close()
    assert process.wait(timeout=10) == 128 + signal.SIGTERM
    assert gone_within(tree, GONE_WITHIN_SECONDS)


def test_control_without_stdin_hup_a_closed_stdin_changes_nothing(
    wrapped: list[subprocess.Popen[str]],
) -> None:
    process, tree = start_wrapped(wrapped, code=PYTHON_WITH_CHILD)
    assert process.stdin is not None
    process.stdin.close()
    time.sleep(0.5)
    assert process.poll() is None
    assert scenarios.alive(tree) == tree
    process.terminate()
    assert process.wait(timeout=10) == 128 + signal.SIGTERM
    assert gone_within(tree, GONE_WITHIN_SECONDS)


# --- the parent's death: one stop, not one a second ---------------------------------

SLOW_TO_STOP = (
    "import os, signal, sys, time\n"
    "terms = []\n"
    "def on(number, frame):\n"
    "    terms.append(time.monotonic())\n"
    "    with open(sys.argv[1], 'a') as file:\n"
    "        file.write('SIGTERM\\n')\n"
    "signal.signal(signal.SIGTERM, on)\n"
    "print(os.getpid(), flush=True)\n"
    "while not terms or time.monotonic() - terms[0] < 2.5:\n"
    "    time.sleep(0.05)\n"
    "sys.exit(0)\n"
)
PARENT = (
    "import subprocess, sys\n"
    "wrapper = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)\n"
    "print(wrapper.pid, wrapper.stdout.readline().strip(), flush=True)\n"
    "wrapper.wait()\n"
)


def test_the_parents_death_stops_the_command_once_however_long_it_takes(
    tmp_path: Path, wrapped: list[subprocess.Popen[str]]
) -> None:
    """The wrapper's stop after its parent died is its own clean ending: the watch's
    WorkerGone, raised again once a second until the wrapper exits, must not send a
    command that takes 2.5 s to stop a SIGTERM a second (it sent three)."""
    log = tmp_path / "terms"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PARENT,
            *WRAPPER,
            "--",
            sys.executable,
            "-c",
            SLOW_TO_STOP,
            str(log),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "EXO_ORPHAN_GUARD": "1"},
    )
    wrapped.append(parent)
    assert parent.stdout is not None
    wrapper_pid, command_pid = (int(word) for word in parent.stdout.readline().split())
    wrapper, command = identity_of(wrapper_pid), identity_of(command_pid)
    assert wrapper is not None and command is not None
    try:
        parent.kill()
        parent.wait()
        assert gone_within([command, wrapper], 6.0)
        assert log.read_text().splitlines() == ["SIGTERM"]
    finally:
        kill_all([command, wrapper])
