"""`systemctl --user` and `loginctl` as far as `service` asks and acts, for a CLI run as
a subprocess (the README's commands, run as written in tests/test_quick_start.py).

This machine has no systemd user session. `install_fakes(directory, state)` writes
`systemctl` and `loginctl` into `directory` (put it on PATH): each runs this file,
which answers as systemd does and keeps the unit's state (enabled, active) in the
JSON file `state`. It starts no unit: the test starts what the unit says.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

UNIT_NAME = "exo-orphan-guard.service"


def install_fakes(directory: Path, state: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for tool in ("systemctl", "loginctl"):
        script = directory / tool
        script.write_text(
            f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} {state} {tool} "$@"\n'
        )
        script.chmod(0o755)


def _unit(home: Path) -> Path:
    return home / ".config" / "systemd" / "user" / UNIT_NAME


def answer(state: dict[str, bool], home: Path, tool: str, words: list[str]) -> tuple[int, str]:
    """The exit status and output of `tool words...`; `state` is changed in place."""
    if tool == "loginctl":
        if words[:1] == ["show-user"] and words[2:] == ["--property=Linger"]:
            return 0, "Linger=yes"
        return 1, f"loginctl: unknown command {' '.join(words)}"
    if words[:1] != ["--user"]:
        return 1, "Failed to connect to bus: this fake knows only --user"
    link = _unit(home).parent / "default.target.wants" / UNIT_NAME
    match words[1:]:
        case ["is-system-running"]:
            return 0, "running"
        case ["is-enabled", unit] if unit == UNIT_NAME:
            return (0, "enabled") if state["enabled"] else (1, "disabled")
        case ["is-active", unit] if unit == UNIT_NAME:
            return (0, "active") if state["active"] else (3, "inactive")
        case ["daemon-reload"]:
            return 0, ""
        case ["enable", *now, unit] if unit == UNIT_NAME and _unit(home).is_file():
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(_unit(home))
            state["enabled"] = True
            state["active"] = state["active"] or now == ["--now"]
            return 0, f"Created symlink {link} -> {_unit(home)}."
        case ["restart", unit] if unit == UNIT_NAME and state["enabled"]:
            state["active"] = True
            return 0, ""
        case ["disable", "--now", unit] if unit == UNIT_NAME:
            link.unlink(missing_ok=True)
            state["enabled"] = state["active"] = False
            return 0, ""
        case _:
            return 1, f"Failed to {words[1] if len(words) > 1 else 'run'}: not faked"


def main(argv: list[str]) -> int:
    state_path, tool, words = Path(argv[1]), argv[2], argv[3:]
    try:
        state: dict[str, bool] = json.loads(state_path.read_text())
    except FileNotFoundError:
        state = {"enabled": False, "active": False}
    status, output = answer(state, Path(os.environ["HOME"]), tool, words)
    state_path.write_text(json.dumps(state))
    if output:
        print(output, file=sys.stdout if status == 0 else sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
