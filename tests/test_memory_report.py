"""Memory an operator can believe: labelled as what it is, in scan, sweep and doctor."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.rig import scenarios
from exo_orphan_guard.sweeper.process_table import ProcessInfo
from exo_orphan_guard.sweeper.verdicts import Verdict
from exo_orphan_guard.system.process_facts import MemoryUsage
from exo_orphan_guard.tools import cli, doctor
from tests.test_doctor import HEALTHY, RUNNER

FOOTPRINT = 313 * 2**30


def orphans_detail(*runners: ProcessInfo) -> str:
    verdicts = tuple(
        Verdict(runner.pid, "kill", "its worker 9 is gone", "registry", runner)
        for runner in runners
    )
    checks = doctor.assess(dataclasses.replace(HEALTHY, verdicts=verdicts))
    return next(check.detail for check in checks if check.name == "orphans")


def test_doctor_sums_a_macs_footprint_and_says_so() -> None:
    # exo PR 2205: 6 GB of RSS, 313 GB of footprint. The footprint is what is held.
    mac_runner = dataclasses.replace(
        RUNNER, rss=6 * 2**30, memory=MemoryUsage("footprint", FOOTPRINT)
    )
    assert orphans_detail(mac_runner).endswith("holding 313.0 GiB (physical footprint)")


def test_doctor_labels_rss_as_rss() -> None:
    linux_runner = dataclasses.replace(RUNNER, memory=MemoryUsage("rss", 2**31))
    assert orphans_detail(linux_runner).endswith("holding 2.0 GiB (RSS)")


@pytest.mark.skipif(sys.platform != "linux", reason="plants processes via /proc")
def test_scan_sweep_and_doctor_report_labelled_memory_of_a_real_orphan(
    exo_python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = scenarios.start_worker(["idle"], watch="none", python=exo_python)
    try:
        scenarios.kill_worker(worker)
        runner = worker.runners[0].identity
        assert cli.main(["scan"]) == 1
        table = capsys.readouterr().out
        assert "MEMORY" in table
        row = next(line for line in table.splitlines() if line.split()[:1] == [str(runner.pid)])
        assert " MiB rss " in row, row
        assert cli.main(["sweep", "--dry-run", "--json"]) == 1
        document = json.loads(capsys.readouterr().out)
        (suspect,) = [entry for entry in document["suspects"] if entry["pid"] == runner.pid]
        assert suspect["memory"]["kind"] == "rss"
        assert suspect["memory"]["bytes"] > 2**20 and suspect["rss_bytes"] > 2**20
        assert cli.main(["doctor", "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["backend"] == system.BACKEND
        orphans = next(check for check in report["checks"] if check["name"] == "orphans")
        assert "(RSS)" in orphans["detail"]
    finally:
        scenarios.cleanup(worker)
