"""One line of `doctor`: OK / WARN / FAIL / SKIP, what was seen, and what to run next."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, final

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
