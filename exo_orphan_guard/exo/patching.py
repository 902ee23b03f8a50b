"""`exo-orphan-guard patch check|apply|revert --exo PATH`: put the hooks into exo.

A series is the ordered patches in `patches/<name>/`: `git format-patch` files
(`git am` takes them as they are), and a cover letter that is not applied. Which
series fits a tree is decided by its supervisor file (renamed in exo #2000) and then
by whether the series applies cleanly forwards (not applied) or backwards (applied).
A tree that an earlier release patched (`patches/earlier/<name>/`, bare diffs) is
found too: revert takes it back, apply replaces it. All files are patched in memory
first; only if every hunk applies is anything written, and a failed write puts back
what was already written. Reverting applies the series backwards, which restores
the original bytes.

A tree no series fits is refused with what `refusal` finds out about it: the hunk
that did not match, the anchors, exo's version, local edits only where git sees
them, and what to do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from . import refusal
from .patch_format import (
    FileDiff,
    HunkMismatchError,
    PatchFormatError,
    apply_hunks,
    parse_unified_diff,
)

PATCHES_DIR: Final = Path(__file__).resolve().parent / "patches"
EARLIER: Final = "earlier"
"""The subdirectory with the series an earlier release wrote into trees."""
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
    earlier: bool = False
    """An earlier release's series: found and reverted, never applied."""

    @property
    def label(self) -> str:
        return f"{self.name} (an earlier release's)" if self.earlier else self.name

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(diff.path for _, diff in self.diffs))


@final
@dataclass(frozen=True, slots=True)
class TreeStatus:
    series: Series
    state: TreeState


def load_series(root: Path = PATCHES_DIR) -> list[Series]:
    """The current series, then the earlier ones (where `root` has them)."""
    series = [_load(root / name, name, earlier=False) for name in SERIES_MARKERS]
    series += [
        _load(root / EARLIER / name, name, earlier=True)
        for name in SERIES_MARKERS
        if (root / EARLIER / name).is_dir()
    ]
    return series


def patch_files(directory: Path) -> list[Path]:
    """The patches of a series in order, without its cover letter."""
    return [patch for patch in sorted(directory.glob("*.patch")) if patch.name != COVER_LETTER]


def _load(directory: Path, name: str, *, earlier: bool) -> Series:
    diffs: list[tuple[str, FileDiff]] = []
    for patch in patch_files(directory):
        try:
            diffs.extend((patch.name, diff) for diff in parse_unified_diff(patch.read_bytes()))
        except PatchFormatError as error:
            raise PatchError(f"{patch}: not a usable patch ({error})") from error
    if not diffs:
        raise PatchError(f"no patches in {directory}: the installation is incomplete")
    return Series(name, tuple(diffs), earlier)


def check(tree: Path, all_series: Sequence[Series] | None = None) -> TreeStatus:
    """Which series fits `tree` and whether it is applied; PatchError otherwise. A tree
    an earlier release patched is "applied" with that release's series."""
    current, *earlier = _series_for(tree, all_series if all_series is not None else load_series())
    originals = _read(tree, current.files)
    forward = _try(current.diffs, originals, reverse=False)
    if isinstance(forward, dict):
        return TreeStatus(current, "not applied")
    backward = _try(current.diffs, originals, reverse=True)
    if isinstance(backward, dict):
        return TreeStatus(current, "applied")
    for series in earlier:
        if isinstance(_try(series.diffs, _read(tree, series.files), reverse=True), dict):
            return TreeStatus(series, "applied")
    # Name the failure of the direction that got further (forward on a tie): where the
    # tree parts from what the series expects. Nothing has been written.
    direction: refusal.Direction = "revert" if backward.progress > forward.progress else "apply"
    failure = backward if direction == "revert" else forward
    mismatch = refusal.Mismatch(
        current.name, WRITTEN_FOR[current.name], direction, failure.path, failure.reason
    )
    refused = refusal.refuse(
        tree,
        mismatch,
        current.files,
        lambda contents: isinstance(_try(current.diffs, contents, reverse=False), dict),
    )
    raise PatchError(refused.line, refused.details)


def apply(tree: Path, all_series: Sequence[Series] | None = None) -> tuple[TreeStatus, bool]:
    """Apply the fitting series; (status, changed). Already applied: nothing changes.
    An earlier release's series is replaced by the current one, in one write."""
    chosen = all_series if all_series is not None else load_series()
    status = check(tree, chosen)
    if status.state == "applied" and not status.series.earlier:
        return status, False
    current = _series_for(tree, chosen)[0]
    steps = [(current, False)]
    if status.series.earlier:
        steps.insert(0, (status.series, True))
    _change(tree, steps)
    return TreeStatus(current, "applied"), True


def revert(tree: Path, all_series: Sequence[Series] | None = None) -> tuple[TreeStatus, bool]:
    """Revert the fitting series to the original bytes; not applied: nothing changes."""
    status = check(tree, all_series)
    if status.state == "not applied":
        return status, False
    _change(tree, [(status.series, True)])
    return TreeStatus(status.series, "not applied"), True


def _change(tree: Path, steps: Sequence[tuple[Series, bool]]) -> None:
    """Each (series, reverse) in turn, in memory, then one write of every file."""
    paths = tuple(dict.fromkeys(path for series, _ in steps for path in series.files))
    originals = _read(tree, paths)
    contents: dict[str, bytes | None] = dict(originals)
    for series, reverse in steps:
        changed = _try(series.diffs, contents, reverse=reverse)
        if not isinstance(changed, dict):  # pragma: no cover - check() just proved it applies
            raise PatchError(changed.reason)
        contents.update(changed)
    _write_all(tree, originals, contents)


def chosen_for(tree: Path) -> tuple[str, str]:
    """(series name, why) for `tree`, by its supervisor file alone: what `export` writes
    even for a tree the series no longer applies to."""
    if not (tree / EXO_MARKER).is_file():
        raise PatchError(f"{tree} is not an exo source tree (no {EXO_MARKER})")
    names = [name for name, marker in SERIES_MARKERS.items() if (tree / marker).is_file()]
    if len(names) != 1:
        known = ", ".join(f"{marker} ({name})" for name, marker in SERIES_MARKERS.items())
        raise PatchError(
            f"no patch series fits the exo tree at {tree}: it should have exactly one of {known}"
        )
    name = names[0]
    return name, f"{tree} has {SERIES_MARKERS[name]}, which only exo {name} has"


def _series_for(tree: Path, all_series: Sequence[Series]) -> list[Series]:
    """The current series that fits `tree`, then the earlier ones of its version."""
    if not (tree / EXO_MARKER).is_file():
        raise PatchError(f"{tree} is not an exo source tree (no {EXO_MARKER})")
    fitting = [series for series in all_series if (tree / SERIES_MARKERS[series.name]).is_file()]
    current = [series for series in fitting if not series.earlier]
    if len(current) != 1:
        known = ", ".join(f"{marker} ({name})" for name, marker in SERIES_MARKERS.items())
        raise PatchError(
            f"no patch series fits the exo tree at {tree}: it should have exactly one of {known}",
            refusal.version_and_anchors(tree),
        )
    return current + [series for series in fitting if series.earlier]


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
