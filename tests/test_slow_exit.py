"""A process SIGKILL is slow to end (a loaded machine can take seconds to tear one
down) is waited for, not reported as stuck until a reboot: the engine waits longer
for what is known to be on its way out (`system.is_exiting`: a SIGKILL pending on
Linux, `E` without `U` in macOS's `ps`). The slow teardown is injected: the SIGKILL
lands after the kill wait."""

from __future__ import annotations

import re
import signal
import threading
import uuid
from pathlib import Path

import pytest

from exo_orphan_guard import system
from exo_orphan_guard.sweeper.sweeping import sweep
from exo_orphan_guard.system import signalling
from exo_orphan_guard.system.identity import ProcessIdentity, liveness
from tests.helpers.processes import start_deaf_orphan

KILL_WAIT = 1.0


def _slow_sigkill(monkeypatch: pytest.MonkeyPatch, orphan: ProcessIdentity) -> None:
    real = signalling.send

    def send(target: ProcessIdentity, number: int) -> signalling.Delivery:
        if number == signal.SIGKILL and target == orphan:
            timer = threading.Timer(KILL_WAIT + 1.0, real, args=(target, number))
            timer.daemon = True
            timer.start()
            return "sent"
        return real(target, number)

    monkeypatch.setattr(signalling, "send", send)


@pytest.mark.parametrize("on_its_way_out", [True, False])
def test_a_process_slow_to_die_is_waited_for_only_if_it_is_on_its_way_out(
    planted: list[ProcessIdentity],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    on_its_way_out: bool,
) -> None:
    token = f"eog-slow-exit-{uuid.uuid4().hex}"
    orphan = start_deaf_orphan(token, tmp_path)
    planted.append(orphan)
    _slow_sigkill(monkeypatch, orphan)

    def is_exiting(pid: int) -> bool:
        return on_its_way_out and pid == orphan.pid

    monkeypatch.setattr(system, "is_exiting", is_exiting)
    report = sweep(
        match=re.escape(token), grace=0.2, kill_wait=KILL_WAIT, fingerprint=False, any_parent=True
    )
    (result,) = [result for result in report.results if result.target == orphan]
    if on_its_way_out:
        assert (result.outcome, result.advice) == ("killed", None)
        assert liveness(orphan) == "gone"
    else:  # nothing says it is dying: at the kill wait it is reported, with the advice
        assert result.outcome == "unkillable" and "reboot" in str(result.advice)
