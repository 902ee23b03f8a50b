"""`selftest --json`: what a Mac user pastes into a bug report, run for real here."""

from __future__ import annotations

import json
import platform
import sys

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.records.host_key import host_key
from exo_orphan_guard.tools import rdma_ports, selftest
from tests.helpers.cli import run_cli


def test_selftest_json_is_one_object_with_every_row() -> None:
    completed = run_cli(
        "selftest", "--json", "--strategy", "auto", "--strategy", "sentinel", timeout=120
    )
    document = json.loads(completed.stdout)
    assert completed.returncode == 0, document
    assert document["schema"] == "exo-orphan-guard/selftest/1" and document["passed"] is True
    assert document["backend"] == system.BACKEND
    assert document["os"]["system"] == platform.system()
    assert document["versions"]["psutil"] is not None
    assert document["host_key"]["kind"] in ("hostname", "hardware-uuid")
    assert {"wired_memory", "rdma"} <= set(document)
    rows = {row["strategy"]: row for row in document["strategies"]}
    assert list(rows) == ["auto", "sentinel", "guard off"]
    assert [runner["kind"] for runner in rows["auto"]["runners"]] == [
        "idle",
        "gil",
        "child",
        "late",
    ]
    # The guard took every runner within the deadline; the control round left them all,
    # and a thread in the runner cannot act while the runner holds the GIL.
    gone = {
        strategy: [runner["kind"] for runner in row["runners"] if runner["latency_ms"] is not None]
        for strategy, row in rows.items()
    }
    assert gone == {
        "auto": list(selftest.KINDS),
        "sentinel": ["idle", "child", "late"],
        "guard off": [],
    }
    assert document["deadline_s"] == selftest.DEADLINE_SECONDS


@pytest.mark.skipif(sys.platform == "darwin", reason="what a Linux machine answers")
def test_the_backends_answers_for_a_bug_report() -> None:
    answers = selftest.backend_answers()
    key = host_key()
    assert answers["host_key"] == {"kind": "hostname", "directory": key.name, "previous": None}
    assert answers["wired_memory"] is None  # measured on macOS only
    assert answers["rdma"] == rdma_ports.to_json(rdma_ports.read_devinfo())
