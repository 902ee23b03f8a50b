"""The exo processes waiting to be watched (`records.watch_requests`): a request
counts while its process lives, and is removed once that process is gone, its pid
taken by another, or the file is not a request."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from exo_orphan_guard.records import guardian_state, watch_requests
from exo_orphan_guard.system.identity import ProcessIdentity, current_identity, identity_of
from exo_orphan_guard.system.process_facts import Pid


def test_a_request_counts_while_its_process_lives(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        identity = identity_of(child.pid)
        assert identity is not None
        assert watch_requests.request(tmp_path, identity)
        assert watch_requests.request(tmp_path, current_identity())
        assert sorted(watch_requests.live_requests(tmp_path), key=lambda p: p.pid) == sorted(
            [identity, current_identity()], key=lambda p: p.pid
        )
    finally:
        child.kill()
        child.wait()
    assert watch_requests.live_requests(tmp_path) == [current_identity()]
    assert sorted(os.listdir(tmp_path / "watch")) == [f"{os.getpid()}.json"]


def test_a_reused_pid_or_a_file_that_is_no_request_is_removed(tmp_path: Path) -> None:
    me = current_identity()
    assert watch_requests.request(tmp_path, ProcessIdentity(me.pid, me.started + 1.0))
    directory = tmp_path / "watch"
    (directory / "77.json").write_text("not json")
    (directory / "78.json").write_text(json.dumps({"pid": 79, "started": 1.0}))
    stale = directory / ".tmp-5-1"
    stale.write_text("{}")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert watch_requests.live_requests(tmp_path) == []
    assert os.listdir(directory) == []


def test_a_state_written_before_leaving_was_known_reads_as_staying(tmp_path: Path) -> None:
    state = guardian_state.GuardianState(Pid(42), 1.0, "boot", 2.0, "worker", "0.1.0")
    document = json.loads(state.to_json())
    del document["leaving"]
    parsed = guardian_state.parse_state(json.dumps(document).encode())
    assert parsed is not None and parsed == state and not parsed.leaving
