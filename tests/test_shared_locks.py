"""tests/helpers/shared_locks.py reads a real multiprocessing lock as another process
maps it: free, held by this process, and a lock that process has not mapped."""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Generator
from contextlib import contextmanager
from multiprocessing.synchronize import Event, Lock
from typing import cast

import pytest

from tests.helpers.shared_locks import held_locks

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/<pid>/mem")
SPAWN = multiprocessing.get_context("spawn")


def _map_and_wait(lock: Lock, ready: Event) -> None:
    del lock  # mapped by being passed, as exo's channels are to its runner
    ready.set()
    time.sleep(60)


def _name(lock: Lock) -> str:
    return cast(str, lock._semlock.name)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]


@contextmanager
def _mapping(lock: Lock) -> Generator[int]:
    """The pid of a spawned process that has `lock` mapped."""
    ready = SPAWN.Event()
    process = SPAWN.Process(target=_map_and_wait, args=(lock, ready), daemon=True)
    process.start()
    try:
        assert ready.wait(60) and process.pid is not None
        yield process.pid
    finally:
        process.kill()
        process.join()


def test_a_lock_held_by_another_process_reads_as_held_where_it_is_mapped() -> None:
    lock, unmapped = SPAWN.Lock(), SPAWN.Lock()
    with _mapping(lock) as pid:
        assert held_locks(pid, [_name(lock), _name(unmapped)]) == []
        assert lock.acquire(timeout=5)
        assert held_locks(pid, [_name(lock), _name(unmapped)]) == [_name(lock)]
        lock.release()
        assert held_locks(pid, [_name(lock)]) == []
        assert unmapped.acquire(timeout=5)
        assert held_locks(pid, [_name(unmapped)]) == []  # not mapped there
