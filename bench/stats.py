"""Samples where some trials never finish: quantiles that say so instead of lying."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Samples:
    values: list[float | None] = field(default_factory=list[float | None])
    """Milliseconds; None for a trial that did not finish within its deadline."""

    def add(self, value: float | None) -> None:
        self.values.append(value)

    @property
    def count(self) -> int:
        return len(self.values)

    @property
    def exited(self) -> int:
        return sum(value is not None for value in self.values)

    def quantile(self, q: float) -> float | None:
        """Nearest-rank quantile, counting unfinished trials as +infinity (None)."""
        if not self.values:
            return None
        ordered = sorted(math.inf if value is None else value for value in self.values)
        rank = max(1, math.ceil(q * len(ordered)))
        value = ordered[rank - 1]
        return None if math.isinf(value) else value

    def quantile_text(self, q: float, deadline_s: float) -> str:
        value = self.quantile(q)
        if value is None:
            return f"> {deadline_s * 1000:.0f} (alive)"
        return f"{value:.1f}"
