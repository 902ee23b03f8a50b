"""The command line, run as users run it: `python -m exo_orphan_guard WORDS...`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

CLI = [sys.executable, "-m", "exo_orphan_guard"]


def run_cli(
    *arguments: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the CLI to its end; its output captured, its exit code not checked."""
    return subprocess.run(
        [*CLI, *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def report_of(completed: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON document of a `scan`/`sweep --json` that ran (exit code 0 or 1)."""
    assert completed.returncode in (0, 1), completed.stderr
    document: dict[str, Any] = json.loads(completed.stdout)
    return document
