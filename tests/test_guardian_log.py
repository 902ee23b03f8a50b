"""The guardian's log is never a reason to fail, and stays bounded (a guardian runs
for months): a real `service run` with its stderr on a full disk, or on a log file
that has outgrown its bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exo_orphan_guard.guardian import log
from exo_orphan_guard.records import endings
from exo_orphan_guard.records.registry import Registry
from exo_orphan_guard.rig import notes as runner_notes
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.system import boot_id, settings
from exo_orphan_guard.system.identity import ProcessIdentity
from tests.helpers.guardian import READY, ended_line
from tests.helpers.waiting import wait_until

pytestmark = [
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc"),
]


def _guardian(stderr: int, *arguments: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "exo_orphan_guard", "service", "run", *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def _stop(guardian: subprocess.Popen[bytes]) -> int:
    if guardian.poll() is None:
        guardian.send_signal(signal.SIGTERM)
        try:
            return guardian.wait(10)
        except subprocess.TimeoutExpired:
            guardian.kill()
    return guardian.wait()


def _begun_by_a_sweep(runner: ProcessIdentity, seconds: float) -> None:
    """A `begun` line from a sweep that signalled `runner` and waits `seconds` more:
    the guardian waits for it too, and says so (an ending's `on_wait`)."""
    registry, problem = Registry.open(settings.registry_dir(), create=True)
    assert registry is not None, problem
    line = endings.Ending(
        event="begun",
        pid=runner.pid,
        started=runner.started,
        boot_id=boot_id(),
        at=time.time(),
        by="sweep",
        why="a planted sweep's SIGINT",
        deadline=time.monotonic() + seconds,
    )
    assert endings.append(registry.path / endings.ENDINGS_NAME, line)


@pytest.mark.parametrize("warned", [False, True], ids=["plain", "a setting warned about"])
def test_a_guardian_whose_log_cannot_be_written_still_guards(
    exo_python: str,
    notes: Path,
    isolated_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
    warned: bool,
) -> None:
    """stderr on /dev/full (ENOSPC on every write): it ends the orphan its start-up
    sweep finds, after waiting (and telling its log) for another sweeper's ending,
    and stops with 0. Before, its first line raised: exit 1 before guarding; and a
    setting's warning (a bad backend) raised the same way after that was fixed."""
    if warned:
        monkeypatch.setenv(settings.BACKEND_ENV, "bogus")
    worker = scenarios.start_worker(
        ["idle"], watch="none", python=exo_python, notes=notes, registry=isolated_environment
    )
    try:
        (runner,) = [runner.identity for runner in worker.runners]
        scenarios.kill_worker(worker)
        _begun_by_a_sweep(runner, 1.0)
        full = os.open("/dev/full", os.O_WRONLY)
        try:
            guardian = _guardian(full)
        finally:
            os.close(full)
        try:
            gone = scenarios.wait_gone([runner], 15.0)[runner]
            assert gone is not None, f"the runner outlived a guardian (exit {guardian.poll()})"
            line = ended_line(isolated_environment, runner)
            assert line is not None and (line.how, line.signal) == ("clean", "SIGINT")
            events = [note["event"] for note in runner_notes.read_notes(notes, runner.pid)]
            assert "atexit" in events, "it was killed, not unwound"
            assert guardian.poll() is None
        finally:
            assert _stop(guardian) == 0
    finally:
        scenarios.cleanup(worker)


def test_a_log_file_that_outgrew_its_bound_is_cut_to_its_newest_lines(tmp_path: Path) -> None:
    """What launchd's `StandardErrorPath` or a worker-started guardian's log becomes
    after months: cut, in place, at the guardian's next line."""
    path = tmp_path / "guardian.log"
    old = b"".join(b"%08d an old line of the guardian's log\n" % n for n in range(40_000))
    assert len(old) > log.MAX_LOG_BYTES
    path.write_bytes(old)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        guardian = _guardian(fd)
    finally:
        os.close(fd)
    try:
        ready = wait_until(lambda: READY.encode() in path.read_bytes(), 30.0)
        assert ready, path.read_bytes()[-500:]
        data = path.read_bytes()
        assert len(data) <= log.KEEP_LOG_BYTES + 4096, len(data)
        first, *lines = data.splitlines()
        assert first.startswith(b"(older lines dropped")
        assert lines[0].endswith(b"an old line of the guardian's log"), "cut mid-line"
        assert b"%08d" % 39_999 in data, "the newest old lines are kept"
    finally:
        assert _stop(guardian) == 0
    assert path.read_bytes().endswith(b"stopped\n")
