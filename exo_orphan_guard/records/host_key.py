"""Which subdirectory of the registry holds this host's records.

A home directory shared over NFS, or a volume shared by containers, holds records
whose pids mean nothing here, so each host (and, on Linux, each pid namespace) keeps
its own. On macOS the key is the Mac's hardware UUID: there is no pid namespace or
machine-id file there, and a key made of the hostname alone moved whenever macOS
renamed the Mac (DHCP and reverse-DNS names, Bonjour's "-2"), leaving every record
written before in a directory no sweep opened. Records under that hostname key are
moved into the hardware-keyed directory the first time a sweep or a runner opens it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from .. import system
from . import trust

HostKeyKind = Literal["hardware-uuid", "hostname"]
"""hardware-uuid: macOS's gethostuuid(3). hostname: the hostname, with the pid
namespace and /etc/machine-id where they exist (Linux: both)."""

HOST_PREFIX: Final = "host-"
_PID_NAMESPACE: Final = "/proc/self/ns/pid"
_MACHINE_ID: Final = "/etc/machine-id"
_MOVED_PREFIXES: Final = ("runner-", "frozen-")
"""Records, and the journals of sweeps that died with processes stopped."""


@final
@dataclass(frozen=True, slots=True)
class HostKey:
    name: str
    """The subdirectory's name."""
    kind: HostKeyKind
    legacy: str | None = None
    """The hostname key this host's records were kept under before, if it differs."""


def host_key() -> HostKey:
    return _host_key(system.hardware_uuid(), socket.gethostname(), os.getpid())


@functools.lru_cache(maxsize=4)
def _host_key(hardware_uuid: str | None, hostname: str, pid: int) -> HostKey:
    """Kept per pid too, as `hostname_key` keeps what it reads: the guardian asks at
    every scan, and the hostname is the only part that can change meanwhile."""
    return key_for(hardware_uuid, hostname)


def key_for(hardware_uuid: str | None, hostname: str) -> HostKey:
    by_hostname = hostname_key(hostname)
    if hardware_uuid is None:
        return HostKey(by_hostname, "hostname")
    # Hashed: a shared home directory need not show the Mac's serial-like identifier.
    digest = hashlib.sha256(f"hardware-uuid\0{hardware_uuid}".encode()).hexdigest()[:12]
    return HostKey(f"{HOST_PREFIX}mac-{digest}", "hardware-uuid", legacy=by_hostname)


def hostname_key(hostname: str) -> str:
    """Readable, and unique per machine and per container (the pid namespace's inode
    differs in each, even on one kernel). Linux's key, unchanged."""
    return _hostname_key(hostname, *_namespace_and_machine(os.getpid()))


@functools.lru_cache(maxsize=8)
def _hostname_key(hostname: str, namespace: str, machine: str) -> str:
    digest = hashlib.sha256("\0".join((hostname, namespace, machine)).encode()).hexdigest()[:12]
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", hostname.split(".")[0])[:40] or "host"
    return f"{HOST_PREFIX}{readable}-{digest}"


@functools.lru_cache(maxsize=2)
def _namespace_and_machine(pid: int) -> tuple[str, str]:
    """Read once per process (by pid: a child forked into a new namespace reads its
    own): neither changes while a process lives, and the guardian asks at every scan."""
    parts: list[str] = []
    for path, read in ((_PID_NAMESPACE, os.readlink), (_MACHINE_ID, _read_text)):
        try:
            parts.append(read(path))
        except OSError:
            parts.append("-")
    return parts[0], parts[1]


def host_directory(base: Path) -> Path:
    return base / host_key().name


def directory_to_read(base: Path, key: HostKey) -> Path:
    """This host's directory (`key`: `host_key()`); the hostname-keyed one while only
    that exists (nothing has opened the registry to write since the key changed): its
    records still count."""
    path = base / key.name
    if key.legacy is not None and not path.exists() and (base / key.legacy).is_dir():
        return base / key.legacy
    return path


def move_legacy_records(base: Path, key: HostKey, uid: int) -> None:
    """Move records and journals from `key.legacy` into `key.name`, once: each is gone
    from the old directory afterwards. Only regular files of `uid` from a directory of
    `uid` that no one else may write; a record already present in the new directory is
    newer, and the old one is dropped."""
    if key.legacy is None:
        return
    legacy = base / key.legacy
    try:
        info = os.lstat(legacy)
        names = os.listdir(legacy)
    except OSError:
        return
    if trust.problem(info, uid, "directory") is not None:
        return
    for name in sorted(names):
        if not name.startswith(_MOVED_PREFIXES):
            continue
        source, target = legacy / name, base / key.name / name
        with contextlib.suppress(OSError):
            if trust.file_problem(os.lstat(source), uid) is not None:
                continue
            with contextlib.suppress(FileExistsError):
                os.link(source, target, follow_symlinks=False)  # never over a newer one
            os.unlink(source)


def _read_text(path: str) -> str:
    with open(path) as file:
        return file.read().strip()
