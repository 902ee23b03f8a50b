"""What a newcomer tripped on with the command line, each a test: help that says the
steps and exit codes as they are, defaults as they are on this OS, one warning format,
no error when the reader of its output leaves early, each selftest row once, the cause
when uv cannot run, and settings `doctor` would let pass."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.exo import uv_project
from exo_orphan_guard.system import once, settings
from exo_orphan_guard.tools import bounds_check, cli
from tests.helpers.cli import CLI, run_cli

PYENV_SHIM_OUTPUT = """pyenv: uv: command not found

The `uv' command exists in these Python versions:
  3.13.0

Note: See 'pyenv help global' for tips on allowing both
      python2 and python3 to be found at the same time.
"""
"""What pyenv's shim says when `uv` is on PATH only as a shim."""


@pytest.mark.parametrize("command", [["scan"], ["sweep"], ["selftest"], ["service", "run"]])
def test_every_command_help_gives_its_exit_codes(command: list[str]) -> None:
    completed = run_cli(*command, "--help")
    assert completed.returncode == 0 and "Exit codes" in completed.stdout, completed.stdout


def test_sweep_help_names_the_steps_an_exo_runner_gets() -> None:
    text = " ".join(run_cli("sweep", "--help").stdout.split())
    assert "SIGINT on its main thread" in text and "SIGTERM, a grace, SIGKILL" not in text
    assert settings.BUSY_WAIT_ENV in text


def test_the_registry_default_in_help_is_this_oss(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (settings.DIR_ENV, settings.EXO_HOME_ENV, settings.XDG_CACHE_ENV):
        monkeypatch.delenv(name, raising=False)
    expected = "~/.cache/exo/orphan-guard" if sys.platform == "linux" else "~/.exo/orphan-guard"
    completed = run_cli("scan", "--help", env=dict(os.environ))
    assert expected in " ".join(completed.stdout.split()), completed.stdout


def test_explain_says_a_sweep_interrupts_first() -> None:
    completed = run_cli("explain", "RTR failed with errno 16")
    assert completed.returncode == 0
    (line,) = [line for line in completed.stdout.splitlines() if "exo-orphan-guard sweep" in line]
    assert "SIGINT" in line and "SIGTERM" not in line


def test_a_reader_that_leaves_early_costs_output_not_an_error() -> None:
    """`exo-orphan-guard explain ... | head -0`: the pipe is closed before a word."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        completed = subprocess.run(
            [*CLI, "explain", "RTR failed with errno 16"],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(writer)
    assert completed.returncode == 0, completed.stderr
    assert "Broken pipe" not in completed.stderr and "Traceback" not in completed.stderr
    assert "Exception ignored" not in completed.stderr, completed.stderr


def test_a_bad_backend_warns_in_the_command_lines_own_words() -> None:
    env = dict(os.environ, **{settings.BACKEND_ENV: "foo"})
    completed = run_cli("scan", "--registry-only", env=env)
    warnings = [line for line in completed.stderr.splitlines() if settings.BACKEND_ENV in line]
    assert warnings and all(line.startswith("exo-orphan-guard: warning: ") for line in warnings), (
        completed.stderr
    )
    assert "| WARNING |" not in completed.stderr


def test_doctor_warns_about_every_setting_it_would_not_take() -> None:
    environ = {
        settings.STRATEGY_ENV: "foo",
        settings.BACKEND_ENV: "bar",
        settings.SCAN_INTERVAL_ENV: "never",
    }
    others = bounds_check.other_setting_warnings(environ)
    assert len(others) == 3
    check = bounds_check.settings_check(settings.Parsed(10.0), settings.Parsed(120.0), others)
    assert check.status == "WARN"
    for value in ("'foo'", "'bar'", "'never'"):
        assert value in check.detail
    assert bounds_check.other_setting_warnings({}) == ()


def test_selftest_prints_each_row_once() -> None:
    completed = run_cli("selftest", "--strategy", "auto", timeout=180)
    rows = [line for line in completed.stdout.splitlines() if re.match(r"auto\s", line)]
    assert len(rows) == 1, completed.stdout
    assert completed.stdout.count("exo-orphan-guard selftest:") == 1


def test_a_uv_that_cannot_run_is_named_by_its_first_line(tmp_path: Path) -> None:
    """pyenv's shim answers for a `uv` that exists only in another Python: its first
    line is the cause, its last line advice about python2 and python3."""
    shim = tmp_path / "uv"
    shim.write_text(f"#!/bin/sh\ncat >&2 <<'TEXT'\n{PYENV_SHIM_OUTPUT}TEXT\nexit 127\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "uv.lock").write_text("")
    state, line = uv_project.lock_state(tmp_path, str(shim))
    assert (state, line) == ("unknown", "pyenv: uv: command not found")
    # A run that worked still ends on uv's summary.
    assert uv_project.summary_line("Resolved 3 packages\nAudited 3 packages\n", ok=True) == (
        "Audited 3 packages"
    )


def test_an_in_process_run_leaves_warnings_and_stdout_as_they_were() -> None:
    """exo's processes warn through loguru: a test, or a caller, that runs the command
    line in its own process must find that so afterwards."""
    stdout = sys.stdout
    assert cli.main(["explain", "errno 16"]) == 0
    assert once.warn_to(None) is None and sys.stdout is stdout
