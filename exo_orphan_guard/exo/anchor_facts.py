"""What looking for an anchor in exo's tree finds: where it is, or why it is missing
(`anchors` does the looking; `refusal` and `placement` read the answers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, final

AnchorName = Literal["entrypoint", "Worker.plan_step", "constants", "Shutdown", "Runner.main"]
MissingReason = Literal[
    "file missing",
    "file unreadable",
    "cannot parse",
    "definition missing",
    "signature differs",
    "first statement differs",
    "field missing",
    "import missing",
    "no place",
]


@final
@dataclass(frozen=True, slots=True)
class Found:
    anchor: AnchorName
    file: str
    """Relative to the tree, `/`-separated."""
    line: int
    """The `def` or `class` line (1-based; after any decorators)."""
    body_line: int
    """The body's first statement."""
    indent: str
    """The body's indentation, as written."""
    detail: str
    """What was found, e.g. the parameters."""
    found: Literal[True] = True

    def describe(self) -> str:
        return f"{self.anchor}: found, {self.file}:{self.line} ({self.detail})"


@final
@dataclass(frozen=True, slots=True)
class Missing:
    anchor: AnchorName
    file: str
    reason: MissingReason
    detail: str
    """Which definition, parameter, statement or field, and what is there instead."""
    found: Literal[False] = False

    def describe(self) -> str:
        return f"{self.anchor}: missing, {self.file}: {self.reason}: {self.detail}"


Anchor = Found | Missing
