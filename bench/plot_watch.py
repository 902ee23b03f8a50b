"""Draw the watch benchmark's latency distributions from its raw samples.

    python -m bench.plot_watch [SAMPLES_JSON [IMAGE]]

Defaults: bench/results/watch-latency.json (written by `make bench`, the same run as
the table in docs/benchmarks.md) and docs/img/watch-latency.png. One panel for idle
runners, one for runners holding the GIL, one for runners in a loop of MLX
operations; each line is the share of runners gone (or, dashed, whose clean ending
had begun) by a given time after their worker's SIGKILL (log time axis). A runner still alive at
the bound is never drawn as an exit: its line stops below 100 % at the bound, and the
legend says "never" for the share that never exited.
"""

# matplotlib's own annotations leave every `**kwargs` untyped:
# pyright: reportUnknownMemberType=false

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, cast

from .stats import Samples
from .watch_latency import SAMPLES_SCHEMA, CellSamples, SamplesDocument

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_SAMPLES: Final = ROOT / "bench" / "results" / "watch-latency.json"
DEFAULT_IMAGE: Final = ROOT / "docs" / "img" / "watch-latency.png"
AXIS_START_MS: Final = 1.0
AXIS_END_MS: Final = 10_000.0
_NEVER_TOP: Final = -0.06
_NEVER_STEP: Final = 0.025

_STYLES: Final[dict[str, tuple[str, str, float]]] = {
    # name: (colour, line style, width). The clean ending is what exo runs: it stands out.
    "auto, clean ending": ("tab:green", "-", 3.0),
    "auto, clean ending: begun": ("tab:green", "--", 2.0),
    "auto": ("black", "-", 2.0),
    "pidfd": ("tab:blue", "-", 1.3),
    "kqueue": ("tab:blue", "-", 1.3),
    "sentinel": ("tab:cyan", "-", 1.3),
    "poll": ("tab:purple", "-", 1.3),
    "pdeathsig": ("tab:brown", "-", 1.3),
    "watchdog": ("tab:olive", "-", 1.3),
    "PR 2205 (getppid every 5 s)": ("tab:orange", "--", 1.8),
    "no guard": ("tab:red", "--", 1.8),
}
_PANELS: Final = (
    ("idle", "idle runner"),
    ("gil", "runner holding the GIL in native code (wedged: killed)"),
    ("mlxloop", "runner in a loop of MLX operations"),
)


@dataclass(frozen=True, slots=True)
class Curve:
    """An empirical CDF where trials still alive at the bound count as never exiting."""

    exits_ms: tuple[float, ...]
    """Sorted exit times of the runners that did exit."""
    count: int
    deadline_ms: float

    @property
    def final_share(self) -> float:
        return len(self.exits_ms) / self.count if self.count else 0.0

    def steps(self, start_ms: float) -> tuple[list[float], list[float]]:
        """Points for a post-step line from `start_ms` to the bound."""
        xs = [start_ms, *self.exits_ms, self.deadline_ms]
        ys = [0.0, *((rank + 1) / self.count for rank in range(len(self.exits_ms)))]
        ys.append(ys[-1])
        return xs, ys


def curve(samples: Sequence[float | None], deadline_s: float) -> Curve:
    exits = sorted(value for value in samples if value is not None)
    return Curve(tuple(exits), len(samples), deadline_s * 1000)


def label(name: str, cell: CellSamples) -> str:
    samples = Samples(list(cell["samples_ms"]))
    exited, count = samples.exited, samples.count
    bound = _duration(cell["deadline_s"] * 1000)
    if exited == 0:
        return f"{name}: never ({count} of {count} alive at {bound})"
    p50, p99 = samples.quantile(0.5), samples.quantile(0.99)
    text = f"{name}: p50 {_duration(p50)}, p99 " + (
        _duration(p99) if p99 is not None else f"> {bound}"
    )
    if exited < count:
        text += f"; never: {count - exited} of {count}"
    return text


def draw(document: SamplesDocument, image: Path) -> None:
    # Imported here: the curves and labels need none of matplotlib's second of imports.
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    shown = [
        (kind, title)
        for kind, title in _PANELS
        if any(cell["runner"] == kind for cell in document["cells"])
    ]
    figure, grid = plt.subplots(
        1, len(shown), figsize=(6.5 * len(shown), 9.0), sharey=True, squeeze=False
    )
    axes = grid[0]
    panels = [[cell for cell in document["cells"] if cell["runner"] == kind] for kind, _ in shown]
    # Both panels share the y axis: give the "never" band room for the fuller one.
    slots = max(1, *(sum(not _any_exit(cell) for cell in cells) for cells in panels))
    for axis, (_, title), cells in zip(axes, shown, panels, strict=True):
        _panel(cast("Axes", axis), title, cells, slots)
    counts = sorted({len(cell["samples_ms"]) for cell in document["cells"]})
    figure.suptitle(
        "Worker SIGKILL → runner gone (dashed: clean ending begun): share of runners "
        "(CDF, log time); mechanism rows with grace 0; "
        f"{' or '.join(str(count) for count in counts)} runners per line",
        fontsize=12,
    )
    figure.text(
        0.5,
        0.005,
        f"{document['command']} on {document['date']}: {document['machine']}. "
        "A line that stops below 100 % ends at its bound: the rest never exited.",
        ha="center",
        fontsize=8,
        color="dimgray",
    )
    figure.tight_layout(rect=(0, 0.03, 1, 0.95))
    image.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(image, dpi=110)
    plt.close(figure)


def _style(name: str) -> tuple[str, str, float]:
    """A row's own style; a `(portable)` row dotted in its strategy's colour."""
    if name in _STYLES:
        return _STYLES[name]
    base = name.replace(" (portable)", "")
    if base != name and base in _STYLES:
        colour, _, width = _STYLES[base]
        return colour, ":", max(1.2, width * 0.8)
    return "dimgray", "-.", 1.2  # the floor: the benchmark's own view of the exit


def _panel(axis: Axes, title: str, cells: Sequence[CellSamples], never_slots: int) -> None:
    from matplotlib.ticker import FuncFormatter

    # Lines that never leave 0 would hide under each other and under the curves that
    # start there: they get a band of their own below 0 %, labelled "never".
    never = 0
    for cell in sorted(cells, key=lambda cell: _order(cell["strategy"])):
        name = cell["strategy"]
        colour, style, width = _style(name)
        line = curve(cell["samples_ms"], cell["deadline_s"])
        xs, ys = line.steps(AXIS_START_MS)
        if line.final_share == 1:
            xs, ys = xs[:-1], ys[:-1]  # all gone: the line ends with the last exit
        if line.final_share == 0:
            ys = [_NEVER_TOP - _NEVER_STEP * never] * len(ys)
            never += 1
        axis.step(
            xs, ys, where="post", color=colour, linestyle=style, linewidth=width,
            label=label(name, cell),
        )  # fmt: skip
        if line.final_share < 1:
            axis.plot(
                [line.deadline_ms], [ys[-1]], marker="x", color=colour, markersize=7,
                linestyle="none",
            )  # fmt: skip
    bottom = _NEVER_TOP - _NEVER_STEP * never_slots
    axis.axhspan(bottom, _NEVER_TOP + _NEVER_STEP / 2, color="0.92", zorder=0)
    axis.set_ylim(bottom, 1.03)
    axis.set_yticks(
        [*(share / 5 for share in range(6)), (bottom + _NEVER_TOP) / 2],
        [*(f"{share * 20}%" for share in range(6)), "never"],
    )
    axis.set_xscale("log")
    axis.set_xlim(AXIS_START_MS, AXIS_END_MS)
    axis.xaxis.set_major_formatter(FuncFormatter(_tick))
    axis.set_xlabel("time after the worker's SIGKILL (x: still alive at the bound)")
    axis.set_ylabel("runners gone")
    axis.set_title(title, fontsize=10)
    axis.grid(True, which="major", alpha=0.3)
    axis.grid(True, which="minor", axis="x", alpha=0.1)
    axis.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, fontsize=7.5, frameon=False
    )


def _any_exit(cell: CellSamples) -> bool:
    return any(value is not None for value in cell["samples_ms"])


def _order(name: str) -> int:
    names = list(_STYLES)
    return names.index(name) if name in names else len(names)


def _tick(value: float, _position: int | None) -> str:
    return f"{value / 1000:g} s" if value >= 1000 else f"{value:g} ms"


def _duration(milliseconds: float | None) -> str:
    if milliseconds is None:
        return "-"
    if milliseconds >= 1000:
        return f"{milliseconds / 1000:.3g} s"
    if milliseconds >= 10:
        return f"{milliseconds:.0f} ms"
    return f"{milliseconds:.1f} ms"


def load(path: Path) -> SamplesDocument:
    document = cast(SamplesDocument, json.loads(path.read_text()))
    if document.get("schema") != SAMPLES_SCHEMA:
        raise ValueError(f"{path}: not a {SAMPLES_SCHEMA} document")
    return document


def main(arguments: Sequence[str]) -> int:
    samples = Path(arguments[0]) if arguments else DEFAULT_SAMPLES
    image = Path(arguments[1]) if len(arguments) > 1 else DEFAULT_IMAGE
    try:
        document = load(samples)
    except (OSError, ValueError) as error:
        print(f"plot_watch: {error}", file=sys.stderr)
        return 2
    draw(document, image)
    print(f"plot_watch: wrote {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
