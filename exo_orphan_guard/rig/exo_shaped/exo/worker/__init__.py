"""exo.worker: the local series' module (`exo.worker.orphan_guard`) is loaded here from
`exo_tree_with_package/`, and `exo.worker.runner` holds the PR's modules."""

from pathlib import Path

__path__.append(
    str(
        Path(__file__).resolve().parents[4]
        / "exo"
        / "exo_tree_with_package"
        / "src"
        / "exo"
        / "worker"
    )
)
