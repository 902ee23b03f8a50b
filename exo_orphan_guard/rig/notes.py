"""What a stand-in runner writes about itself, for tests that look once its worker is
dead (the worker it would have told is gone): one JSON line per event in
`<directory>/<pid>.jsonl`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class RunnerNotes:
    def __init__(self, directory: str) -> None:
        self._path = os.path.join(directory, f"{os.getpid()}.jsonl") if directory else None

    @property
    def stderr_path(self) -> str | None:
        """Where a runner that keeps its stderr for the test puts it (`read_stderr`)."""
        return None if self._path is None else self._path.removesuffix(".jsonl") + ".stderr"

    def write(self, event: str, **details: Any) -> None:
        if self._path is not None:
            line = json.dumps({"event": event, "at": time.monotonic(), **details})
            with open(self._path, "a") as file:
                file.write(line + "\n")


def read_notes(directory: Path, pid: int) -> list[dict[str, Any]]:
    """The events runner `pid` wrote, in order."""
    try:
        lines = (directory / f"{pid}.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines]


def read_stderr(directory: Path, pid: int) -> str:
    """What runner `pid` wrote to its stderr, if it kept it (`RunnerNotes.stderr_path`)."""
    try:
        return (directory / f"{pid}.stderr").read_text()
    except FileNotFoundError:
        return ""
