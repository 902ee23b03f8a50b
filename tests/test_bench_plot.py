"""The latency picture never draws a runner that outlived the bound as one that exited."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import plot_watch
from bench.watch_latency import SAMPLES_SCHEMA, CellSamples, SamplesDocument


def cell(strategy: str, samples: list[float | None], deadline_s: float = 1.0) -> CellSamples:
    return CellSamples(strategy=strategy, runner="gil", deadline_s=deadline_s, samples_ms=samples)


def test_runners_alive_at_the_bound_keep_the_curve_below_one() -> None:
    line = plot_watch.curve([3.0, None, 1.5], deadline_s=1.0)
    assert line.final_share == pytest.approx(2 / 3)
    xs, ys = line.steps(start_ms=1.0)
    assert xs == [1.0, 1.5, 3.0, 1000.0]
    assert ys == pytest.approx([0.0, 1 / 3, 2 / 3, 2 / 3])


def test_labels_say_never_for_what_never_exited() -> None:
    assert plot_watch.label("pidfd", cell("pidfd", [None] * 200)) == (
        "pidfd: never (200 of 200 alive at 1 s)"
    )
    partial = plot_watch.label("auto", cell("auto", [2.0, 4.0, None, None]))
    assert partial == "auto: p50 4.0 ms, p99 > 1 s; never: 2 of 4"
    assert plot_watch.label("auto", cell("auto", [5.25, 17.0])) == "auto: p50 5.2 ms, p99 17 ms"


def test_a_picture_is_drawn_from_a_samples_document(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="needs matplotlib (bench extra)")
    document = SamplesDocument(
        schema=SAMPLES_SCHEMA,
        command="python -m bench.run_all --only watch --rounds 2",
        machine="test",
        date="2026-11-30",
        rounds=2,
        cells=[
            cell("auto", [4.0, 6.0]),
            CellSamples(strategy="auto", runner="idle", deadline_s=1.0, samples_ms=[3.0, 5.0]),
            cell("pidfd", [None, None]),
            cell("no guard", [None, None], deadline_s=6.0),
        ],
    )
    image = tmp_path / "img" / "watch.png"
    plot_watch.draw(document, image)
    assert image.read_bytes().startswith(b"\x89PNG")


def test_a_file_that_is_not_a_samples_document_is_refused(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"schema": "something else"}')
    assert plot_watch.main([str(wrong), str(tmp_path / "out.png")]) == 2
    assert not (tmp_path / "out.png").exists()
