"""One line of `doctor`: OK / WARN / FAIL / SKIP, what was seen, and what to run next;
and the screen (or the JSON) of them."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, final

from .. import system

Status = Literal["OK", "WARN", "FAIL", "SKIP"]


@final
@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    next_step: str | None = None
    figures: Mapping[str, object] = field(default_factory=dict[str, object])
    """What the line was judged on, for `--json` (empty: the detail says it all)."""


def render(checks: Sequence[Check]) -> str:
    system_name = f"{platform.system()} {platform.release()}"
    header = (
        f"exo-orphan-guard doctor: {platform.node()} "
        f"({system_name}, uid {os.geteuid()}, {system.BACKEND} backend)"
    )
    lines = [header]
    for check in checks:
        line = f"{check.status:<5} {check.name:<12} {check.detail}"
        if check.next_step is not None:
            line += f"\n{'':18}-> {check.next_step}"
        lines.append(line)
    return "\n".join(lines)


def to_json(checks: Sequence[Check]) -> str:
    return json.dumps(
        {
            "schema": "exo-orphan-guard/doctor/1",
            "backend": system.BACKEND,
            "checks": [
                {
                    "name": c.name,
                    "status": c.status,
                    "detail": c.detail,
                    "next": c.next_step,
                    **({"figures": dict(c.figures)} if c.figures else {}),
                }
                for c in checks
            ],
        },
        indent=2,
    )


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(check.status == "FAIL" for check in checks) else 0
