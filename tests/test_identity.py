from __future__ import annotations

import subprocess
import sys

import pytest

from exo_orphan_guard.system.identity import (
    ProcessIdentity,
    current_identity,
    identity_of,
    liveness,
)
from exo_orphan_guard.system.process_facts import Pid


def test_encode_decode_round_trip() -> None:
    me = current_identity()
    assert ProcessIdentity.decode(me.encode()) == me


@pytest.mark.parametrize("text", ["", "12", "x:1", "12:abc", "-3:1.0", "0:1.0", "5:nan", "5:-1"])
def test_decode_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        ProcessIdentity.decode(text)


def test_a_live_process_is_alive_and_a_reused_pid_is_not_it() -> None:
    me = current_identity()
    assert liveness(me) == "alive"
    assert liveness(ProcessIdentity(me.pid, me.started + 0.01)) == "gone"


def test_an_exited_unreaped_child_counts_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = identity_of(child.pid)
    assert identity is not None
    while child.poll() is None and liveness(identity) == "alive":
        pass
    assert liveness(identity) == "gone"
    child.wait()
    assert identity_of(child.pid) is None
    assert liveness(ProcessIdentity(Pid(child.pid), identity.started)) == "gone"
