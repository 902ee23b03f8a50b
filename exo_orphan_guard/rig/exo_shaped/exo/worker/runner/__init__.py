"""exo.worker.runner: the PR's modules (`parent_watch`, `runner_record`,
`leftover_runners`, `task_relay`) are loaded here from `exo_tree/`, the very files the
series adds to exo, beside the exo-shaped `bootstrap`."""

from pathlib import Path

__path__.append(
    str(
        Path(__file__).resolve().parents[5]
        / "exo"
        / "exo_tree"
        / "src"
        / "exo"
        / "worker"
        / "runner"
    )
)
