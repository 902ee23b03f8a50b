"""`selftest --json`: what a Mac user pastes into a bug report, run for real here."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

from exo_orphan_guard import system


def test_selftest_json_is_one_object_with_every_row() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "exo_orphan_guard", "selftest", "--json", "--strategy", "auto"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    document = json.loads(completed.stdout)
    assert completed.returncode == 0, document
    assert document["schema"] == "exo-orphan-guard/selftest/1" and document["passed"] is True
    assert document["backend"] == system.BACKEND
    assert document["os"]["system"] == platform.system()
    assert document["versions"]["psutil"] is not None
    rows = {row["strategy"]: row for row in document["strategies"]}
    assert list(rows) == ["auto", "guard off"]
    assert [runner["kind"] for runner in rows["auto"]["runners"]] == [
        "idle",
        "gil",
        "child",
        "late",
    ]
    # The guard took every runner within the deadline; the control round left them all.
    assert all(runner["latency_ms"] is not None for runner in rows["auto"]["runners"])
    assert all(runner["latency_ms"] is None for runner in rows["guard off"]["runners"])
