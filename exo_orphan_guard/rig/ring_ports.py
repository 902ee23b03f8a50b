"""Loopback ports for the MLX ring groups of the rig: free ones, the hostfile naming
them, and the wait for a rank's own socket to listen."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path

IN_INIT_SETTLE_SECONDS = 0.5
_LISTEN_TIMEOUT_SECONDS = 10.0


def free_loopback_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_listening(port: int, timeout: float = _LISTEN_TIMEOUT_SECONDS) -> bool:
    """Until a socket listens on loopback `port`: a rank binds its own inside init, and
    a loaded machine takes longer than `IN_INIT_SETTLE_SECONDS` to get there. Linux
    reads /proc/net; elsewhere it settles for that fixed wait."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        time.sleep(IN_INIT_SETTLE_SECONDS)
        return True
    wanted = f":{port:04X}"
    deadline = time.monotonic() + timeout
    while True:
        for table in tables:
            with contextlib.suppress(OSError):
                for line in table.read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[1].endswith(wanted) and fields[3] == "0A":  # 0A: LISTEN
                        return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def write_hostfile(directory: Path, ports: list[int]) -> Path:
    path = directory / "hosts.json"
    path.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in ports]))
    return path
