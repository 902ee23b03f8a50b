"""The suite's own safety nets fail a session that breaks them: a test session that
takes one of its decoys, or leaves a process behind, exits 1 and says what happened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the checks read /proc")

_TAKES_A_DECOY = """
import os, signal

def test_takes_a_decoy(session_decoys) -> None:
    os.kill(session_decoys.reparented.pid, signal.SIGKILL)
"""

_LEAVES_A_PROCESS = """
import subprocess

def test_leaves_a_process() -> None:
    subprocess.Popen(["sleep", "600"], start_new_session=True)
"""

_BEHAVES = """
def test_behaves(session_decoys) -> None:
    assert not session_decoys.gone()
"""


def run_session(
    tmp_path: Path, body: str, *, leftover_grace: float = 5.0
) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", str(test_file)],
        cwd=ROOT,
        env=dict(os.environ, EOG_LEFTOVER_GRACE_SECONDS=str(leftover_grace)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_session_that_takes_a_decoy_fails(tmp_path: Path) -> None:
    finished = run_session(tmp_path, _TAKES_A_DECOY)
    assert finished.returncode == 1, finished.stdout
    assert "signalled what it did not start" in finished.stdout
    assert "reparented process" in finished.stdout


def test_a_session_that_leaves_a_process_fails(tmp_path: Path) -> None:
    # Its leak never leaves by itself: the whole grace would prove nothing more.
    finished = run_session(tmp_path, _LEAVES_A_PROCESS, leftover_grace=0.5)
    assert finished.returncode == 1, finished.stdout
    assert "outlived it" in finished.stdout and "sleep 600" in finished.stdout


def test_a_session_that_behaves_passes(tmp_path: Path) -> None:
    finished = run_session(tmp_path, _BEHAVES)
    assert finished.returncode == 0, finished.stdout
