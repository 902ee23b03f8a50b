"""`exo-orphan-guard patch check|apply|revert --exo PATH`: put the hooks into exo.

Two series (`placement`): the PR, exo's own guard in exo's code only, and on top of
it the local series with the package's part inside exo (`with package`), which
`apply` adds only when asked. A series is the ordered patches in
`patches/<name>/` (the local one's in `patches/with-package/<name>/`): `git
format-patch` files (`git am` takes them as they are), and a cover letter that is
not applied. A stored series fits the tree it was written for (exo main and v1.0.71,
told apart by their supervisor file); every other tree whose anchors `ast` finds
gets the same lines placed at the anchors (`placement`), as a series computed for
that tree. All files are patched in memory first; only if every hunk applies is
anything written, and a failed write puts back what was already written. Reverting
applies the series backwards, which restores the original bytes.

A tree without the anchors is refused with what `refusal` finds out about it: the
anchor, exo's version, local edits only where git sees them, and what to do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from . import format_patch, placement, refusal
from .patch_format import (
    FileDiff,
    PatchFormatError,
    apply_diffs,
    parse_unified_diff,
)

PATCHES_DIR: Final = Path(__file__).resolve().parent / "patches"
WITH_PACKAGE_DIR: Final = PATCHES_DIR / "with-package"
PLACED: Final = "anchors"
"""The name of a series computed for a tree the stored one does not fit."""
COVER_LETTER: Final = "0000-cover-letter.patch"
EXO_MARKER: Final = "src/exo/worker/runner/bootstrap.py"
SERIES_MARKERS: Final[Mapping[str, str]] = {
    "v1.0.71": "src/exo/worker/runner/runner_supervisor.py",
    "main": "src/exo/worker/runner/supervisor.py",
}
"""Each series and the file only its exo version has (exo v1.0.71 at fd707de30b42,
exo main at b5375f8cee43)."""
WRITTEN_FOR: Final[Mapping[str, str]] = {
    "v1.0.71": "v1.0.71 (fd707de30b42)",
    "main": "main (b5375f8cee43)",
}

TreeState = Literal["applied", "not applied"]


class PatchError(Exception):
    """One line for the operator: what is wrong and where (`str()`); `details`: the
    lines that say why and what to do, where there are some."""

    def __init__(self, line: str, details: Sequence[str] = ()) -> None:
        super().__init__(line)
        self.details: tuple[str, ...] = tuple(details)


@final
@dataclass(frozen=True, slots=True)
class Series:
    name: str
    diffs: tuple[tuple[str, FileDiff], ...]
    """(patch file name, file diff), in application order."""
    directory: Path | None = None
    """Where its patches are (None: computed for one tree, `placed_series`)."""

    @property
    def label(self) -> str:
        if self.name == PLACED:
            return "placed at the anchors"
        return self.name

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(diff.path for _, diff in self.diffs))


@final
@dataclass(frozen=True, slots=True)
class TreeStatus:
    series: Series
    """The PR's series."""
    state: TreeState
    local: Series | None = None
    """The local series, where it is in the tree (`with_package`)."""

    @property
    def with_package(self) -> TreeState:
        return "applied" if self.local is not None else "not applied"


def load_series(root: Path = PATCHES_DIR) -> list[Series]:
    """The stored series, one for each exo version in `SERIES_MARKERS` that has one
    under `root`."""
    return [_load(root / name, name) for name in SERIES_MARKERS if (root / name).is_dir()]


def patch_files(directory: Path) -> list[Path]:
    """The patches of a series in order, without its cover letter."""
    return [patch for patch in sorted(directory.glob("*.patch")) if patch.name != COVER_LETTER]


def _load(directory: Path, name: str) -> Series:
    diffs: list[tuple[str, FileDiff]] = []
    for patch in patch_files(directory):
        try:
            diffs.extend((patch.name, diff) for diff in parse_unified_diff(patch.read_bytes()))
        except PatchFormatError as error:
            raise PatchError(f"{patch}: not a usable patch ({error})") from error
    if not diffs:
        raise PatchError(f"no patches in {directory}: the installation is incomplete")
    return Series(name, tuple(diffs), directory)


def check(tree: Path, all_series: Sequence[Series] | None = None) -> TreeStatus:
    """Which PR series fits `tree`, whether it is applied, and whether the local
    series is in on top of it; PatchError otherwise."""
    contents = _read(tree, _inputs(all_series))
    local = _local_in(tree, contents)
    if local is not None:
        contents.update(_applied(local, contents, reverse=True))
    return TreeStatus(*_pr_status(tree, contents, all_series), local)


def _pr_status(
    tree: Path, contents: dict[str, bytes | None], all_series: Sequence[Series] | None
) -> tuple[Series, TreeState]:
    chosen = all_series if all_series is not None else load_series()
    current = _series_for(tree, chosen)
    if current is not None:
        originals = {path: contents[path] for path in current.files}
        if isinstance(apply_diffs(current.diffs, originals, reverse=False), dict):
            return current, "not applied"
        if isinstance(apply_diffs(current.diffs, originals, reverse=True), dict):
            return current, "applied"
    placed = placement.placement(contents, placement.pr_footprint(contents))
    if isinstance(placed, placement.Placed):
        return placed_series(placed), placed.state
    raise _refusal(tree, placed)


def _stored_local(
    tree: Path, contents: Mapping[str, bytes | None], *, applied: bool
) -> Series | None:
    """The stored local series for `tree`, if it is in `contents` (`applied`) or would
    apply to them."""
    stored = _series_for(tree, load_series(WITH_PACKAGE_DIR))
    if stored is None:
        return None
    originals = {path: contents[path] for path in stored.files}
    fits = isinstance(apply_diffs(stored.diffs, originals, reverse=applied), dict)
    return stored if fits else None


def _local_in(tree: Path, contents: Mapping[str, bytes | None]) -> Series | None:
    """The local series, where it is in `contents` (the stored one or one placed)."""
    if (stored := _stored_local(tree, contents, applied=True)) is not None:
        return stored
    placed = placement.placement(contents, placement.WITH_PACKAGE)
    if isinstance(placed, placement.Placed) and placed.state == "applied":
        return placed_series(placed)
    return None


def local_series(tree: Path) -> Series:
    """The local series for `tree` with the PR in (and the local one not): the stored
    one where it applies, else one placed at the anchors."""
    contents = _read(tree, _inputs(None))
    if (stored := _stored_local(tree, contents, applied=False)) is not None:
        return stored
    placed = placement.placement(contents, placement.WITH_PACKAGE)
    if isinstance(placed, placement.Placed):
        return placed_series(placed)
    raise _refusal(tree, placed)


def _inputs(all_series: Sequence[Series] | None) -> tuple[str, ...]:
    stored = [
        *(all_series if all_series is not None else load_series()),
        *load_series(WITH_PACKAGE_DIR),
    ]
    return tuple(
        dict.fromkeys([*(p for series in stored for p in series.files), *placement.inputs()])
    )


def _refusal(tree: Path, problem: placement.Problem) -> PatchError:
    """Why nothing fits: the anchor that is missing, or hooks that are partly in."""
    if problem.anchor is not None:
        mismatch = refusal.Mismatch(
            PLACED, "", "apply", problem.file, problem.reason, kind="anchor"
        )
    else:
        mismatch = refusal.Mismatch(
            PLACED, "", "revert", problem.file, problem.reason, kind="partial"
        )
    refused = refusal.refuse(
        tree,
        mismatch,
        placement.inputs(),
        lambda contents: isinstance(
            placement.placement(contents, placement.pr_footprint(contents)), placement.Placed
        ),
    )
    return PatchError(refused.line, refused.details)


def placed_series(placed: placement.Placed) -> Series:
    """A footprint placed at the anchors of one tree, as a series of file diffs."""
    diffs: list[tuple[str, FileDiff]] = []
    names = patch_names(placed.footprint)
    for name, paths in zip(names, placed.footprint.patches, strict=True):
        for change in format_patch.changes_between(placed.original, placed.patched, paths):
            diff_text = format_patch.file_diff(change)
            diffs.extend((name, diff) for diff in parse_unified_diff(diff_text))
    return Series(PLACED, tuple(diffs))


PATCH_NAMES: Final = (
    "0001-feature-Add-runner-records-and-guard-settings.patch",
    "0002-feature-Hand-runners-Shutdown-if-worker-dies.patch",
    "0003-feature-End-leftover-runners-before-planning.patch",
)
"""The PR's patches, one for each group of its footprint's `patches`."""
LOCAL_PATCH_NAMES: Final = ("0001-feature-Run-exo-orphan-guard-before-planning.patch",)


def patch_names(footprint: placement.Footprint) -> tuple[str, ...]:
    return LOCAL_PATCH_NAMES if footprint is placement.WITH_PACKAGE else PATCH_NAMES


def apply(
    tree: Path, all_series: Sequence[Series] | None = None, *, with_package: bool = False
) -> tuple[TreeStatus, bool]:
    """Apply the fitting PR series, and with `with_package` the local series on top;
    (status, changed). What is applied already stays as it is."""
    status = check(tree, all_series)
    changed = False
    if status.state == "not applied":
        if status.local is not None:  # pragma: no cover - the local series needs the PR
            raise PatchError(f"{tree}: the local series is in without the PR")
        _change(tree, status.series, reverse=False)
        changed = True
    local = status.local
    if with_package and local is None:
        local = local_series(tree)
        _change(tree, local, reverse=False)
        changed = True
    return TreeStatus(status.series, "applied", local), changed


def footprint(tree: Path, all_series: Sequence[Series] | None = None) -> placement.Placed:
    """The tree without the PR and with it, whichever series is in it (the stored
    one, one placed at the anchors, or none): what `export` writes as a series."""
    status = check(tree, all_series)
    contents = _read(tree, _inputs(all_series))
    if status.local is not None:
        contents.update(_applied(status.local, contents, reverse=True))
    if status.state == "applied":
        contents.update(_applied(status.series, contents, reverse=True))
    placed = placement.placement(contents, placement.pr_footprint(contents))
    if isinstance(placed, placement.Problem):  # pragma: no cover - check() placed it
        raise PatchError(placed.reason)
    return placed


def revert(tree: Path, all_series: Sequence[Series] | None = None) -> tuple[TreeStatus, bool]:
    """Revert the local series, then the PR, to the original bytes; not applied:
    nothing changes."""
    status = check(tree, all_series)
    changed = False
    if status.local is not None:
        _change(tree, status.local, reverse=True)
        changed = True
    if status.state == "applied":
        _change(tree, status.series, reverse=True)
        changed = True
    return TreeStatus(status.series, "not applied"), changed


def _change(tree: Path, series: Series, *, reverse: bool) -> None:
    """The series (backwards, for `reverse`) in memory, then one write of every file."""
    originals = _read(tree, series.files)
    contents: dict[str, bytes | None] = dict(originals)
    contents.update(_applied(series, contents, reverse=reverse))
    _write_all(tree, originals, contents)


def _applied(
    series: Series, contents: Mapping[str, bytes | None], *, reverse: bool
) -> dict[str, bytes | None]:
    changed = apply_diffs(series.diffs, contents, reverse=reverse)
    if not isinstance(changed, dict):  # pragma: no cover - check() just proved it applies
        raise PatchError(changed.reason)
    return changed


def chosen_for(tree: Path) -> tuple[str, str]:
    """(series name, why) for `tree`, by its supervisor file alone: which stored series
    `export` writes for a tree nothing fits."""
    if not (tree / EXO_MARKER).is_file():
        raise PatchError(f"{tree} is not an exo source tree (no {EXO_MARKER})")
    names = [name for name, marker in SERIES_MARKERS.items() if (tree / marker).is_file()]
    if len(names) != 1:
        return "main", f"{tree} has neither or both supervisor files: exo main's is the newest"
    name = names[0]
    return name, f"{tree} has {SERIES_MARKERS[name]}, which only exo {name} has"


def _series_for(tree: Path, all_series: Sequence[Series]) -> Series | None:
    """The stored series that fits `tree` by its supervisor file (None: neither or both
    files)."""
    if not (tree / EXO_MARKER).is_file():
        raise PatchError(f"{tree} is not an exo source tree (no {EXO_MARKER})")
    fitting = [series for series in all_series if (tree / SERIES_MARKERS[series.name]).is_file()]
    return fitting[0] if len(fitting) == 1 else None


def _read(tree: Path, paths: Sequence[str]) -> dict[str, bytes | None]:
    contents: dict[str, bytes | None] = {}
    for path in paths:
        try:
            contents[path] = (tree / path).read_bytes()
        except FileNotFoundError:
            contents[path] = None
        except OSError as error:
            raise PatchError(f"cannot read {tree / path}: {error.strerror}") from error
    return contents


def _write_all(
    tree: Path, originals: Mapping[str, bytes | None], contents: Mapping[str, bytes | None]
) -> None:
    done: list[str] = []
    try:
        for path, content in contents.items():
            if content == originals[path]:
                continue
            _write_one(tree / path, content)
            done.append(path)
    except OSError as error:
        for path in reversed(done):
            with contextlib.suppress(OSError):
                _write_one(tree / path, originals[path])
        raise PatchError(
            f"cannot write {error.filename}: {error.strerror}; nothing changed"
        ) from error


def _write_one(target: Path, content: bytes | None) -> None:
    if content is None:
        target.unlink(missing_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)  # a file the series creates
        write_atomically(target, content)


def write_atomically(target: Path, content: bytes) -> None:
    """Replace `target` whole (a reader never sees half a file), keeping its mode."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
    temporary = target.with_name(f".{target.name}.orphan-guard-tmp")
    temporary.write_bytes(content)
    os.chmod(temporary, mode)
    os.replace(temporary, target)
