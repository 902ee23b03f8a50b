"""Reports from a stand-in's stdout: one JSON document per line, each awaited with a
deadline, so that a stand-in that hangs or dies fails the scenario instead of
blocking it. The one reader for the scenario worker, the ring group and the
launcher."""

from __future__ import annotations

import json
import os
import select
import time
from typing import IO, final


@final
class JsonLines:
    def __init__(self, stream: IO[bytes] | IO[str]) -> None:
        """`stream` is read through its file descriptor only: nothing else may read it."""
        self._fd = stream.fileno()
        self._pending = b""

    def next(self, timeout: float) -> object | None:
        """The next line's document; None at the timeout or at end of file. ValueError
        (json's) for a line that is not JSON."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._fd, 65536) if ready else b""
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        document: object = json.loads(line)
        return document
