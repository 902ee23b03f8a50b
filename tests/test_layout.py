"""docs/reference.md's module table names every module and the layer it sits in, one
row per layer in the import contract's order, and docs/design.md's Layers line lists the
same layers: a module or a layer without its place in the documents fails here. And
no module is over 400 lines."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "exo_orphan_guard"
ROW = re.compile(r"\| `(\w+)/` \| [^|]+ \| (.+) \|")


def contract() -> tuple[list[str], list[str]]:
    """The layers contract's layers, top first (siblings in their written order), and
    the root modules it leaves out."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    (layers,) = [entry for entry in contracts if entry["type"] == "layers"]
    written: list[str] = layers["layers"]  # pyright: ignore[reportAssignmentType]
    ignored: list[str] = layers["exhaustive_ignores"]  # pyright: ignore[reportAssignmentType]
    return [name.strip() for layer in written for name in re.split(r"[|:]", layer)], ignored


def layout_table() -> dict[str, set[str]]:
    """Each row's layer and the modules it names (notes in parentheses left out)."""
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        if (row := ROW.fullmatch(line)) is not None:
            named = re.sub(r"\([^()]*\)", "", row.group(2))
            rows[row.group(1)] = set(re.findall(r"`(\w+)`", named))
    return rows


def modules(layer: str) -> set[str]:
    return {path.stem for path in (PACKAGE / layer).glob("*.py")}


def test_the_table_has_one_row_per_layer_in_the_contracts_order() -> None:
    layers, _ = contract()
    assert list(layout_table()) == layers


def test_the_table_names_every_module_of_each_layer_and_no_other() -> None:
    for layer, named in layout_table().items():
        present = modules(layer) - {"__init__"}
        named -= {"__init__"}
        assert named == present, (
            f"docs/reference.md's row for {layer}/: unlisted {sorted(present - named)}, "
            f"no such module {sorted(named - present)}"
        )


def test_every_subpackage_is_a_layer_and_the_root_holds_only_what_the_contract_ignores() -> None:
    layers, ignored = contract()
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == set(layers)
    assert modules(".") == {"__init__", *ignored}


def test_the_design_lists_the_same_layers() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    block = design.split("\n## Layers\n", 1)[1].split("```", 2)[1]
    listed = [name.strip() for name in re.split(r"[>|]", block) if name.strip()]
    layers, _ = contract()
    assert listed == layers


MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    """The house rule (one module per concept): a module past it is split, not waived."""
    sources = [
        path
        for top in ("exo_orphan_guard", "bench", "tests", "scripts")
        for path in (ROOT / top).rglob("*.py")
    ]
    assert len(sources) > 100
    too_long = {
        str(path.relative_to(ROOT)): count
        for path in sources
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}
