"""The value of a multiprocessing lock as a given process maps it (Linux, glibc): how a
test tells, from outside, that a dead process left a lock shared with a runner held.

A POSIX named semaphore (`/dev/shm/sem.<name>`) is a 64-bit word in glibc: its value
in the low half, its waiters in the high half. A `multiprocessing` lock is one, with
value 1 when free and 0 when held."""

from __future__ import annotations

from collections.abc import Iterable


def held_locks(pid: int, names: Iterable[str]) -> list[str]:
    """Of the named locks `pid` has mapped, those held (value 0); a name it has not
    mapped is left out. Raises OSError if `pid` cannot be read."""
    wanted = {f"/dev/shm/sem.{name.lstrip('/')}": name for name in names}
    held: list[str] = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as memory:
        for line in maps:
            fields = line.split(maxsplit=5)
            path = (
                fields[5].removesuffix("\n").removesuffix(" (deleted)") if len(fields) > 5 else ""
            )
            if path not in wanted:
                continue
            memory.seek(int(fields[0].split("-", 1)[0], 16))
            if int.from_bytes(memory.read(8), "little") & 0xFFFFFFFF == 0:
                held.append(wanted.pop(path))
    return held
