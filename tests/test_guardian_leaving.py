"""A guardian exo's worker started leaves only when no exo is left, and never leaves
a new exo unwatched: a second exo that found it running (no runners yet, no pidfile:
every release, the app) is watched through its request (`records.watch_requests`),
and a guardian that is leaving never answers for a new one. Real exo-shaped workers
with `ensure_guardian`, real guardians, real SIGKILLs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.exo.guardian_start import ensure_guardian
from exo_orphan_guard.records import guardian_state
from exo_orphan_guard.system import boot_id, settings
from exo_orphan_guard.system.identity import identity_of
from tests.helpers.guardian import guardian_home, stand_in_guardian
from tests.helpers.waiting import wait_until

pytestmark = [
    pytest.mark.machine_wide,
    pytest.mark.skipif(sys.platform != "linux", reason="plants processes through /proc"),
]

_EXO = """
import contextlib, multiprocessing, sys, time
with contextlib.suppress(ImportError):
    import exo_rs  # the stand-in for exo's Rust extension, where the rig makes one
from exo_orphan_guard.exo.guardian_start import ensure_guardian

if __name__ == "__main__":
    print(ensure_guardian(), flush=True)
    sys.stdin.readline()  # the test's word: load a model
    runner = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(3600,))
    runner.start()
    print(runner.pid, flush=True)
    time.sleep(3600)
"""
"""An exo worker as far as the guardian can tell: its runner comes only when asked,
and it writes no pidfile."""


_SCENE = """
import json, os, signal, subprocess, sys, time
from exo_orphan_guard.records import guardian_state
from exo_orphan_guard.records.user_dir import user_dir
from exo_orphan_guard.system import boot_id
from exo_orphan_guard.system.identity import identity_of, liveness

python, script = sys.argv[1], sys.argv[2]
home, _ = user_dir(create=True)
log = home / "guardian.log"


def until(check, seconds):
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def exo():
    # Its runner shares no pipe with the namespace's init (tini): an init that shares
    # one is taken for the runner's spawner (issue 40, item 4).
    process = subprocess.Popen(
        [python, script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return process, process.stdout.readline().strip()


first, first_said = exo()
guardian = identity_of(int(first_said.split("(pid ")[1].split(")")[0]))
until(lambda: guardian_state.running(home, boot_id()) is not None, 15)
second, second_said = exo()
first.kill()
first.wait()
watched = f"watching exo {second.pid} ("
until(lambda: liveness(guardian) == "gone" or watched in log.read_text(), 15)
stayed = liveness(guardian) == "alive"
second.stdin.write("load\\n")
second.stdin.flush()
runner = identity_of(int(second.stdout.readline()))
second.kill()
second.wait()
ended = until(lambda: liveness(runner) == "gone", 10)
left = until(lambda: liveness(guardian) == "gone", 15)
print(json.dumps({
    "first": first_said, "second": second_said, "guardian": guardian.pid,
    "stayed": stayed, "ended": ended, "left": left, "log": log.read_text(),
}), flush=True)
"""
"""In a pid namespace of its own, where these two exo processes are the only ones
(the session's decoys would keep a guardian beside them busy): what each exo's
`ensure_guardian` said, whether the guardian stayed once the first was killed,
whether the runner the second loaded then was ended once it was killed, and whether
the guardian left at last."""


def test_a_new_exo_beside_a_guardian_that_would_leave_is_watched(
    exo_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first exo starts a guardian; a second finds it running; the first is
    killed. Before, the guardian then saw no exo (the second had no runners), left two
    scans later, and the runner the second loaded after that was never ended."""
    unshare, tini = shutil.which("unshare"), shutil.which("tini")
    if os.geteuid() != 0 or unshare is None or tini is None:
        pytest.skip("a pid namespace of its own needs root, util-linux unshare and tini")
    monkeypatch.setenv(settings.SCAN_INTERVAL_ENV, "0.2")
    script = tmp_path / "exo_worker.py"
    script.write_text(_EXO)
    scene = subprocess.run(
        [
            unshare,
            "--pid",
            "--fork",
            "--mount-proc",
            tini,
            "--",
            exo_python,
            "-c",
            _SCENE,
            exo_python,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert scene.returncode == 0, scene.stderr
    found = json.loads(scene.stdout.splitlines()[-1])
    guardian = found["guardian"]
    assert found["first"].startswith("started a guardian"), found
    assert found["second"] == f"the guardian runs (pid {guardian}, worker)", found
    assert found["stayed"], f"it left the second exo unwatched:\n{found['log']}"
    assert found["ended"], f"the second exo's runner outlived it:\n{found['log']}"
    assert found["left"] and "no exo process left to watch: leaving" in found["log"]


def _guardian_pid(said: str) -> int:
    return int(said.split("(pid ")[1].split(")")[0])


def test_a_leaving_guardian_never_answers_for_a_new_exo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guardian whose state says it is leaving: the worker starts another, which
    waits for the lock (not leaving at once, as it does beside one that guards) and
    watches the worker once it has it."""
    monkeypatch.setenv(settings.SCAN_INTERVAL_ENV, "0.2")
    home = guardian_home()
    started: int | None = None
    try:
        with stand_in_guardian(home, "worker", leaving=True):
            said = ensure_guardian()
            assert said.startswith("started a guardian"), said
            started = _guardian_pid(said)
            log = home / "guardian.log"
            assert wait_until(lambda: "waiting to take over" in log.read_text(), 15.0)
            assert identity_of(started) is not None, log.read_text()
        assert wait_until(lambda: f"watching exo {os.getpid()} (" in log.read_text(), 15.0), (
            log.read_text()
        )
        state = guardian_state.running(home, boot_id())
        assert state is not None and state.pid == started and not state.leaving
    finally:
        if started is not None and identity_of(started) is not None:
            os.kill(started, signal.SIGTERM)
            assert wait_until(lambda: identity_of(started) is None, 15.0)
