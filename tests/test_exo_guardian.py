"""The guardian (`exo-orphan-guard service run`) against exo's real worker and runner,
**unpatched** (no hooks in exo, `EXO_ORPHAN_GUARD` unset), at the five versions
`make test-exo` builds. The worker is SIGKILLed with the guardian watching it; the
guardian sends each of its runners SIGINT at once and kills what is still there at its
busy wait (`EXO_ORPHAN_GUARD_BUSY_WAIT`):

| the runner, when its worker dies | with the guardian | without |
|---|---|---|
| idle, waiting for its next task | exits through Python (atexit ran), soon | orphaned |
| inside one long `mx.eval` | the eval ends, then it exits through Python | orphaned |
| decoding (exo main), its event pipe full | exit blocked: killed at the busy wait | orphaned |

`exo_support/guardian_site` puts the runner there and marks its exit (an atexit
probe). The guardian runs from this package's own venv, never exo's; the seconds from
the worker's SIGKILL to the idle runner gone print with `-s`. Needs EXO_SRC and
MLX_LM_SRC, as `make test-exo`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Final, Literal

import pytest

from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.rig.notes import read_notes
from exo_orphan_guard.system import settings
from exo_orphan_guard.system.identity import ProcessIdentity, identity_of
from tests.helpers.exo_trees import COMMITS, SUPPORT, VERSION_IDS, exo_tree, exo_venv, exo_worker
from tests.helpers.guardian import ended_line
from tests.helpers.processes import describe, signal_masks
from tests.helpers.waiting import wait_for_note

# The guardian ends runners of every exo process it can see: confined only.
pytestmark = [
    pytest.mark.exo,
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
]

Doing = Literal["idle", "eval", "decode"]

IDLE_BOUND: Final = 10.0
"""Generous: the idle runner was gone 0.4-1.4 s after the kill (`-s` prints it)."""
EVAL_SECONDS: Final = 6.0
EXIT_BOUND: Final = 10.0
"""From the eval's return to the runner gone."""
BUSY_WAIT: Final[dict[Doing, float]] = {"idle": 30.0, "eval": 60.0, "decode": 3.0}
"""The guardian's busy wait: past every bound where the runner must exit through
Python (a kill there fails the test), short where it cannot. The eval is sized to
EVAL_SECONDS before it begins; on a loaded machine it has run twice as long."""
KILL_BOUND: Final = 5.0
"""From the busy wait to the runner killed."""
SEEN_BOUND: Final = 60.0
"""For the guardian to find the worker and its runner (it rescans every few seconds)."""
SETTLE_SECONDS: Final = 0.5
"""For the runner to be inside its eval after noting it began (no event says so)."""

READY: Final = re.compile(r"guardian: watching")
WATCHING: Final = re.compile(r"watching exo (\d+) \((\d+) runner")
"""`watching exo <pid> (<n> runner(s)...)`: it has an exit watch on exo <pid>."""


def _cases() -> list[object]:
    # A decode loop this reaches only on exo main (`Runner.handle_generation_tasks`).
    return [
        pytest.param(version, doing, id=f"{VERSION_IDS[version]}-{doing}")
        for version in COMMITS
        for doing in ("idle", "eval", "decode")
        if doing != "decode" or version == "main"
    ]


class Guardian:
    """`python -m exo_orphan_guard service run` in the foreground, from this package's
    venv, its registry in `registry`; what it prints, kept line by line."""

    def __init__(self, registry: Path, busy_wait: float) -> None:
        environment = dict(os.environ)
        environment.pop(settings.TOGGLE_ENV, None)
        environment.update(
            {
                settings.DIR_ENV: str(registry),
                settings.BUSY_WAIT_ENV: f"{busy_wait!r}",
                # The SIGINT wait is the busy wait, never below the grace.
                settings.GRACE_ENV: "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "exo_orphan_guard", "service", "run"],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines[-60:])

    def wait_for(self, pattern: re.Pattern[str], timeout: float, what: str) -> re.Match[str]:
        """The first line matching `pattern`; fails the test if none comes in time or
        the guardian exits first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if found := pattern.search(line):
                        return found
                seen = len(self.lines)
                left = deadline - time.monotonic()
                exited = self.process.poll()
                assert exited is None, f"the guardian exited ({exited}) before {what}:\n" + (
                    "\n".join(self.lines[-60:])
                )
                assert left > 0, f"the guardian never said {what}:\n" + "\n".join(self.lines[-60:])
                self._changed.wait(min(left, 0.5))

    def watching(self, worker: int, timeout: float) -> int:
        """Waits until the guardian watches `worker` with a runner; how many it named."""
        pattern = re.compile(WATCHING.pattern.replace(r"(\d+)", str(worker), 1))
        found = self.wait_for(pattern, timeout, f"it watches exo {worker} and its runner")
        runners = int(found.group(1))
        assert runners >= 1, self.output()
        return runners

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(5.0)


@contextlib.contextmanager
def guardian_running(registry: Path, busy_wait: float) -> Generator[Guardian]:
    guardian = Guardian(registry, busy_wait)
    try:
        guardian.wait_for(READY, 30.0, "it is ready")
        yield guardian
        assert guardian.process.poll() is None, "the guardian exited:\n" + guardian.output()
    finally:
        guardian.stop()


def _events(notes: Path, pid: int) -> list[str]:
    return [note["event"] for note in read_notes(notes, pid)]


def _state(runner: ProcessIdentity) -> str:
    return f"{describe([runner.pid])} {signal_masks([runner.pid])}"


@pytest.mark.parametrize(("version", "doing"), _cases())
@pytest.mark.parametrize("guarded", [True, False], ids=["guardian", "no-guardian"])
def test_the_guardian_ends_an_unpatched_exos_runners(
    version: str,
    doing: Doing,
    guarded: bool,
    exo_work: Path,
    exo_venv_cache: Path,
    tmp_path: Path,
) -> None:
    tree = exo_tree(exo_work, version, patched=False)
    venv = exo_venv(tree, exo_venv_cache, runner=True)
    notes = tmp_path / "notes"
    notes.mkdir()
    registry = tmp_path / "guardian-registry"
    extra = {
        "PYTHONPATH": str(SUPPORT / "guardian_site"),
        "EOG_GUARDIAN_NOTES": str(notes),
        "EOG_GUARDIAN_MODE": doing,
        "EOG_GUARDIAN_EVAL_SECONDS": str(EVAL_SECONDS),
        "EOG_HARNESS_STALL_ON_SIGUSR2": "1",
    }
    with contextlib.ExitStack() as stack:
        guardian = (
            stack.enter_context(guardian_running(registry, BUSY_WAIT[doing])) if guarded else None
        )
        report = stack.enter_context(exo_worker(tree, venv, version, guard=None, extra_env=extra))
        worker: int = report["worker_pid"]
        runner = identity_of(report["runner_pid"])
        assert runner is not None
        if guardian is not None:
            guardian.watching(worker, SEEN_BOUND)
        match doing:
            case "idle":
                pass
            case "eval":
                wait_for_note(notes, runner.pid, "eval begun", 120.0)
                time.sleep(SETTLE_SECONDS)
            case "decode":
                wait_for_note(notes, runner.pid, "decoding", 60.0)
                # The worker stops reading (hung), its runner's event pipe fills.
                os.kill(worker, signal.SIGUSR2)
                wait_for_note(notes, runner.pid, "event pipe full", 30.0)
        killed_at = time.monotonic()
        os.kill(worker, signal.SIGKILL)  # the worker's pid alone
        match doing:
            case "idle":
                bound = IDLE_BOUND
            case "eval":
                returned = wait_for_note(notes, runner.pid, "eval returned", BUSY_WAIT["eval"])
                bound = returned["at"] + EXIT_BOUND - time.monotonic()
            case "decode":
                bound = BUSY_WAIT["decode"] + KILL_BOUND
        gone = scenarios.wait_gone([runner], bound)[runner]
        if guardian is None:
            _check_orphaned(version, doing, runner, worker, gone, bound, notes)
        else:
            _check_ended(version, doing, runner, guardian, registry, killed_at, gone, notes)


def _check_orphaned(
    version: str,
    doing: Doing,
    runner: ProcessIdentity,
    worker: int,
    gone: float | None,
    bound: float,
    notes: Path,
) -> None:
    """The control: the same runner, the same wait, no guardian."""
    noted = read_notes(notes, runner.pid)
    assert gone is None, f"exo's runner ended with no guardian: {noted}"
    (parent,) = describe([runner.pid])
    print(f"\nexo {version} {doing}, no guardian, alive {bound:.1f} s on: {parent}")
    assert f"ppid={worker} " not in parent, parent
    assert "atexit" not in _events(notes, runner.pid), noted


def _check_ended(
    version: str,
    doing: Doing,
    runner: ProcessIdentity,
    guardian: Guardian,
    registry: Path,
    killed_at: float,
    gone: float | None,
    notes: Path,
) -> None:
    noted = read_notes(notes, runner.pid)
    state = "gone" if gone is not None else _state(runner)
    assert gone is not None, f"exo's runner outlived its worker: {state} {noted}\n" + (
        guardian.output()
    )
    ending = ended_line(registry, runner)
    after = gone - killed_at
    returns = [note["at"] for note in noted if note["event"] == "eval returned"]
    since = "".join(f" ({gone - at:.3f} s after its eval returned)" for at in returns)
    print(
        f"\nexo {version} {doing}: gone {after:.3f} s after the worker's SIGKILL{since}: {ending}"
    )
    assert ending is not None, guardian.output()
    assert ending.by == "guardian", ending
    events = _events(notes, runner.pid)
    match doing:
        case "idle":
            assert (ending.step, ending.signal) == ("interrupt", "SIGINT"), ending
            assert "atexit" in events, noted  # it left through Python
            assert after < IDLE_BOUND, after
        case "eval":
            assert (ending.step, ending.signal) == ("interrupt", "SIGINT"), ending
            (returned,) = (note for note in noted if note["event"] == "eval returned")
            # Inside the call when its worker died; the call ran to its end, and the
            # SIGINT was taken the moment it returned.
            assert killed_at < returned["at"], (killed_at, returned)
            assert returned["took"] >= EVAL_SECONDS * 0.8, returned
            assert returned["raised"] == "KeyboardInterrupt", returned
            assert "atexit" in events, noted
            assert gone - returned["at"] < EXIT_BOUND, (gone, returned)
        case "decode":
            assert (ending.step, ending.signal) == ("busy_wait", "SIGKILL"), ending
            left = [note for note in noted if note["event"] == "decode left"]
            assert [note["raised"] for note in left] == ["KeyboardInterrupt"], noted
            assert "atexit" not in events, noted  # its exit never got there
            busy_wait = BUSY_WAIT["decode"]
            assert busy_wait <= after < busy_wait + KILL_BOUND, after
