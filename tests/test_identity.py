from __future__ import annotations

import os
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


def test_a_forked_child_is_itself_not_the_parent_it_was_forked_from() -> None:
    """This process's identity is read once and kept: a forked child, a process of its
    own with the parent's memory, must not be handed the parent's."""
    me = current_identity()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the forked child
        os.close(read)
        os.write(write, current_identity().encode().encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        told = ProcessIdentity.decode(pipe.read().decode())
    os.waitpid(child, 0)
    assert told != me and told.pid == child
    assert current_identity() == me == identity_of(os.getpid())
