"""`exo-orphan-guard patch check|apply|revert --exo PATH`: put the hooks into exo.

The footprint is a new hooks module (`exo_tree/`) and two calls, each with its
import beside it, at anchors exo has not moved since v1.0.61 (`anchors`). A series
is the ordered patches in `patches/<name>/`: `git format-patch` files (`git am`
takes them as they are), and a cover letter that is not applied. The stored series
fits the two trees it was written for (exo main and v1.0.71, told apart by their
supervisor file); every other tree whose anchors `ast` finds gets the same lines
placed at the anchors (`placement`), as a series computed for that tree. All files
are patched in memory first; only if every hunk applies is anything written, and a
failed write puts back what was already written. Reverting applies the series
backwards, which restores the original bytes.

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
    HunkMismatchError,
    PatchFormatError,
    apply_hunks,
    parse_unified_diff,
)

PATCHES_DIR: Final = Path(__file__).resolve().parent / "patches"
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
    state: TreeState


def load_series(root: Path = PATCHES_DIR) -> list[Series]:
    """The stored series, one for each exo version in `SERIES_MARKERS`."""
    return [_load(root / name, name) for name in SERIES_MARKERS]


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
    """Which series fits `tree` and whether it is applied; PatchError otherwise."""
    chosen = all_series if all_series is not None else load_series()
    current = _series_for(tree, chosen)
    if current is not None:
        originals = _read(tree, current.files)
        if isinstance(_try(current.diffs, originals, reverse=False), dict):
            return TreeStatus(current, "not applied")
        if isinstance(_try(current.diffs, originals, reverse=True), dict):
            return TreeStatus(current, "applied")
    placed = placement.placement(_read(tree, placement.inputs()))
    if isinstance(placed, placement.Placed):
        return TreeStatus(placed_series(placed), placed.state)
    raise _refusal(tree, placed)


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
        lambda contents: isinstance(placement.placement(contents), placement.Placed),
    )
    return PatchError(refused.line, refused.details)


def placed_series(placed: placement.Placed) -> Series:
    """The hooks placed at the anchors of one tree, as a series of file diffs."""
    diffs: list[tuple[str, FileDiff]] = []
    for name, paths in zip(PATCH_NAMES, placement.patches(), strict=True):
        for change in format_patch.changes_between(placed.original, placed.patched, paths):
            diff_text = format_patch.file_diff(change)
            diffs.extend((name, diff) for diff in parse_unified_diff(diff_text))
    return Series(PLACED, tuple(diffs))


PATCH_NAMES: Final = (
    "0001-add-optional-orphan-guard-hooks-module.patch",
    "0002-guard-runners-from-the-top-of-entrypoint.patch",
    "0003-sweep-before-the-worker-s-plan-loop.patch",
)
"""The stored series' patches, one for each group of `placement.patches()`."""


def apply(tree: Path, all_series: Sequence[Series] | None = None) -> tuple[TreeStatus, bool]:
    """Apply the fitting series; (status, changed). Already applied: nothing changes."""
    status = check(tree, all_series)
    if status.state == "applied":
        return status, False
    _change(tree, status.series, reverse=False)
    return TreeStatus(status.series, "applied"), True


def footprint(tree: Path, all_series: Sequence[Series] | None = None) -> placement.Placed:
    """The tree without the hooks and with them, whichever series is in it (the stored
    one, one placed at the anchors, or none): what `export` writes as a series."""
    status = check(tree, all_series)
    contents = _read(tree, tuple(dict.fromkeys([*status.series.files, *placement.inputs()])))
    if status.state == "applied":
        contents.update(_applied(status.series, contents, reverse=True))
    placed = placement.placement(contents)
    if isinstance(placed, placement.Problem):  # pragma: no cover - check() placed it
        raise PatchError(placed.reason)
    return placed


def revert(tree: Path, all_series: Sequence[Series] | None = None) -> tuple[TreeStatus, bool]:
    """Revert the fitting series to the original bytes; not applied: nothing changes."""
    status = check(tree, all_series)
    if status.state == "not applied":
        return status, False
    _change(tree, status.series, reverse=True)
    return TreeStatus(status.series, "not applied"), True


def _change(tree: Path, series: Series, *, reverse: bool) -> None:
    """The series (backwards, for `reverse`) in memory, then one write of every file."""
    originals = _read(tree, series.files)
    contents: dict[str, bytes | None] = dict(originals)
    contents.update(_applied(series, contents, reverse=reverse))
    _write_all(tree, originals, contents)


def _applied(
    series: Series, contents: Mapping[str, bytes | None], *, reverse: bool
) -> dict[str, bytes | None]:
    changed = _try(series.diffs, contents, reverse=reverse)
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


@final
@dataclass(frozen=True, slots=True)
class _Failure:
    path: str
    reason: str
    progress: int
    """File diffs applied before this one failed."""


def _try(
    diffs: Sequence[tuple[str, FileDiff]], originals: Mapping[str, bytes | None], *, reverse: bool
) -> dict[str, bytes | None] | _Failure:
    """The new contents of every file, or why the first failing hunk fails."""
    contents = dict(originals)
    ordered = list(reversed(diffs)) if reverse else list(diffs)
    for progress, (patch_name, diff) in enumerate(ordered):
        step = diff.reversed() if reverse else diff
        current = contents[step.path]
        if step.old_path is None and current is not None:
            return _Failure(
                step.path, f"{step.path} already exists ({patch_name} creates it)", progress
            )
        if step.old_path is not None and current is None:
            return _Failure(
                step.path, f"{step.path} is missing ({patch_name} changes it)", progress
            )
        try:
            updated = apply_hunks(current or b"", step.hunks)
        except HunkMismatchError as error:
            return _Failure(
                step.path, f"{step.path}, {error} of {patch_name} does not match", progress
            )
        if step.new_path is None:
            if updated:
                return _Failure(
                    step.path, f"{step.path} differs from what {patch_name} created", progress
                )
            contents[step.path] = None
        else:
            contents[step.path] = updated
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
