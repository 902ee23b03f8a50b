"""Draw the reach: exo's commits along time, reached by `patch apply` or not, and
whether their anchors are found; releases marked.

    python -m bench.plot_reach [RESULTS_JSONL [IMAGE]]

Defaults: bench/results/reach.jsonl (written by `make reach`) and docs/img/reach.png.
"""

# matplotlib's own annotations leave every `**kwargs` untyped:
# pyright: reportUnknownMemberType=false

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.dates as mdates
import matplotlib.pyplot as plt

from .reach import RESULTS, Record, fingerprint, load
from .reach_table import all_anchors

ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_IMAGE: Final = ROOT / "docs" / "img" / "reach.png"
_ROWS: Final = (
    # (y, label): what each row of marks says about a tree.
    (1.0, "patch apply"),
    # Not a count: the series' anchors have changed in number (three, then four).
    (0.0, "every anchor\nfound"),
)


def points(records: Sequence[Record]) -> tuple[list[tuple[float, float, bool]], ...]:
    """Per row: (date as matplotlib's day number, y, yes) for every tree."""
    apply_row = [(_when(record), 1.0, record["reached"]) for record in records]
    anchor_row = [(_when(record), 0.0, all_anchors(record)) for record in records]
    return apply_row, anchor_row


def draw(records: Sequence[Record], image: Path, command: str, tip_name: str = "main") -> None:
    figure, axis = plt.subplots(figsize=(13.0, 4.2))
    size = 6 if len(records) < 100 else 4  # every commit: smaller marks, fewer overlaps
    for number, row in enumerate(points(records)):
        kinds = [_kind(record, ok, apply_row=number == 0) for record, (_, _, ok) in zip(
            records, row, strict=True
        )]  # fmt: skip
        for kind, colour, marker, label in (
            ("stored", "tab:green", "o", "yes: the stored series as it is"),
            ("placed", "tab:blue", "s", "yes: placed at the anchors"),
            ("yes", "tab:green", "o", "yes"),
            ("no", "tab:red", "x", "no"),
        ):
            marks = zip(row, kinds, strict=True)
            chosen = [(when, y) for (when, y, _), got in marks if got == kind]
            if chosen:
                axis.plot(
                    [when for when, _ in chosen], [y for _, y in chosen], linestyle="none",
                    marker=marker, color=colour, markersize=size, label=label,
                )  # fmt: skip
    line = [record for record in records if record["first_parent_index"] is not None]
    tip = max(line, key=lambda record: record["first_parent_index"] or 0) if line else None
    marked = [(record, record["release"] or "") for record in records if record["release"]]
    if tip is not None and not tip["release"]:
        marked.append((tip, f"{tip_name} ({tip['commit'][:7]})"))
    for number, (record, text) in enumerate(marked):
        when = _when(record)
        axis.axvline(when, color="0.6", linestyle=":", linewidth=1, zorder=0)
        # Releases days apart: every other label higher, so neighbours do not overlap.
        axis.text(
            when, 1.3 + 0.3 * (number % 2), text, rotation=45, fontsize=8, ha="left",
            va="bottom",
        )  # fmt: skip
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axis.legend(unique.values(), unique.keys(), loc="center right", fontsize=8, frameon=False)
    axis.set_yticks([y for y, _ in _ROWS], [label for _, label in _ROWS])
    axis.set_ylim(-0.6, 2.1)
    if records:  # room on the right for the last label
        first, last = min(map(_when, records)), max(map(_when, records))
        axis.set_xlim(first - 4, last + max(12.0, (last - first) * 0.06))
    axis.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
    axis.grid(True, axis="x", alpha=0.2)
    reached = sum(record["reached"] for record in records)
    placed = sum(_kind(record, record["reached"], apply_row=True) == "placed" for record in records)
    whole = sum(all_anchors(record) for record in records)
    axis.set_title(
        f"exo's trees from v1.0.61 to main: patch apply reaches {reached} of {len(records)} "
        f"({placed} placed at the anchors), the anchors are found in {whole} of {len(records)}",
        fontsize=11,
        pad=38,
    )
    figure.text(
        0.5, 0.01, f"{command}; dotted: releases (v1.0.64 to v1.0.67 sit off main's line)",
        ha="center", fontsize=8, color="dimgray",
    )  # fmt: skip
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    image.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(image, dpi=110)
    plt.close(figure)


def _kind(record: Record, ok: bool, *, apply_row: bool) -> str:
    """How a mark is drawn: for `patch apply`, which series reached the tree."""
    if not ok:
        return "no"
    if not apply_row:
        return "yes"
    return "placed" if record["apply_line"].startswith("series placed") else "stored"


def _when(record: Record) -> float:
    when: float = mdates.date2num(datetime.datetime.fromisoformat(record["date"]))
    return when


def main(argv: Sequence[str]) -> int:
    results = Path(argv[0]) if argv else RESULTS
    image = Path(argv[1]) if len(argv) > 1 else DEFAULT_IMAGE
    measured = load(results, fingerprint()).values()
    records = sorted(measured, key=lambda record: record["date"])
    draw(records, image, f"python -m bench.plot_reach {results.name}")
    print(image)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
