"""Unified diffs as data, and applying them to bytes in memory.

Pure: no file system. A hunk applies only where its old lines match exactly (no
fuzz), at its stated line or the nearest offset, so what it changes is exactly what
its author saw; reversing it restores the original bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, final

_HUNK_HEADER: Final = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE: Final = b"\\ No newline at end of file"
DEV_NULL: Final = "/dev/null"


class PatchFormatError(ValueError):
    """A patch file that is not a unified diff we can apply."""


@final
class HunkMismatchError(Exception):
    def __init__(self, index: int, header: str) -> None:
        super().__init__(f"hunk {index} ({header})")
        self.index = index
        self.header = header


@final
@dataclass(frozen=True, slots=True)
class Hunk:
    header: str
    old_start: int
    old_lines: tuple[bytes, ...]
    new_lines: tuple[bytes, ...]

    def reversed(self) -> Hunk:
        return Hunk(self.header, self.old_start, self.new_lines, self.old_lines)


@final
@dataclass(frozen=True, slots=True)
class FileDiff:
    old_path: str | None
    """None: the diff creates the file."""
    new_path: str | None
    """None: the diff deletes the file."""
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        path = self.new_path or self.old_path
        assert path is not None
        return path

    def reversed(self) -> FileDiff:
        return FileDiff(self.new_path, self.old_path, tuple(hunk.reversed() for hunk in self.hunks))


def parse_unified_diff(data: bytes) -> tuple[FileDiff, ...]:
    """`git diff` output (a/ and b/ prefixes) into file diffs."""
    lines = data.splitlines(keepends=True)
    files: list[FileDiff] = []
    index = 0
    while index < len(lines):
        if not lines[index].startswith(b"--- "):
            index += 1
            continue
        if index + 1 >= len(lines) or not lines[index + 1].startswith(b"+++ "):
            raise PatchFormatError(f"line {index + 1}: '---' without '+++'")
        old_path = _path(lines[index][4:])
        new_path = _path(lines[index + 1][4:])
        index += 2
        hunks: list[Hunk] = []
        while index < len(lines) and lines[index].startswith(b"@@"):
            hunk, index = _parse_hunk(lines, index)
            hunks.append(hunk)
        if not hunks:
            raise PatchFormatError(f"no hunks for {new_path or old_path}")
        files.append(FileDiff(old_path, new_path, tuple(hunks)))
    if not files:
        raise PatchFormatError("no file diffs found")
    return tuple(files)


def apply_hunks(original: bytes, hunks: Sequence[Hunk]) -> bytes:
    """Apply in order; HunkMismatchError names the first hunk whose old lines are not
    there."""
    lines = original.splitlines(keepends=True)
    offset = 0
    searched_from = 0
    for number, hunk in enumerate(hunks, start=1):
        expected = (
            max(0, hunk.old_start - 1 + offset) if hunk.old_lines else hunk.old_start + offset
        )
        position = _find(lines, hunk.old_lines, expected, searched_from)
        if position is None:
            raise HunkMismatchError(number, hunk.header)
        lines[position : position + len(hunk.old_lines)] = hunk.new_lines
        offset = position - (hunk.old_start - 1) + len(hunk.new_lines) - len(hunk.old_lines)
        searched_from = position + len(hunk.new_lines)
    return b"".join(lines)


def _find(lines: list[bytes], wanted: tuple[bytes, ...], expected: int, start: int) -> int | None:
    """The position of `wanted` nearest `expected`, not before `start`."""
    if not wanted:
        return min(max(expected, start), len(lines))
    last = len(lines) - len(wanted)
    # Far enough to reach either end of the file from `expected`, which may lie past it.
    for distance in range(max(expected, len(lines)) + 1):
        for position in (expected - distance, expected + distance):
            if (
                start <= position <= last
                and tuple(lines[position : position + len(wanted)]) == wanted
            ):
                return position
        if expected - distance < start and expected + distance > last:
            return None
    return None


def _parse_hunk(lines: list[bytes], index: int) -> tuple[Hunk, int]:
    header_line = lines[index].rstrip(b"\r\n")
    found = _HUNK_HEADER.match(header_line)
    if found is None:
        raise PatchFormatError(f"line {index + 1}: bad hunk header")
    old_start = int(found.group(1))
    old_count = int(found.group(2) or b"1")
    new_count = int(found.group(4) or b"1")
    header = found.group(0).decode()
    old: list[bytes] = []
    new: list[bytes] = []
    index += 1
    while (len(old) < old_count or len(new) < new_count) and index < len(lines):
        line = lines[index]
        kind, body = line[:1], line[1:]
        if kind == b" ":
            old.append(body)
            new.append(body)
        elif kind == b"-":
            old.append(body)
        elif kind == b"+":
            new.append(body)
        elif line.rstrip(b"\r\n") == b"":
            old.append(b"\n")
            new.append(b"\n")
        else:
            raise PatchFormatError(f"line {index + 1}: unexpected {line[:20]!r} in a hunk")
        index += 1
        if index < len(lines) and lines[index].startswith(_NO_NEWLINE):
            _strip_last_newline(old if kind != b"+" else None, new if kind != b"-" else None)
            index += 1
    if len(old) != old_count or len(new) != new_count:
        raise PatchFormatError(f"{header}: hunk is shorter than its header says")
    return Hunk(header, old_start, tuple(old), tuple(new)), index


def _strip_last_newline(*sides: list[bytes] | None) -> None:
    for side in sides:
        if side:
            side[-1] = side[-1].rstrip(b"\n")


def _path(raw: bytes) -> str | None:
    text = raw.rstrip(b"\r\n").split(b"\t")[0].decode()
    if text == DEV_NULL:
        return None
    if text.startswith(("a/", "b/")):
        return text[2:]
    raise PatchFormatError(f"expected an a/ or b/ path, got {text!r}")


@final
@dataclass(frozen=True, slots=True)
class DiffFailure:
    path: str
    reason: str
    progress: int
    """File diffs applied before this one failed."""


def apply_diffs(
    diffs: Sequence[tuple[str, FileDiff]], originals: Mapping[str, bytes | None], *, reverse: bool
) -> dict[str, bytes | None] | DiffFailure:
    """The new contents of every file after `diffs` (each named by its patch), or why
    the first failing hunk fails."""
    contents = dict(originals)
    ordered = list(reversed(diffs)) if reverse else list(diffs)
    for progress, (patch_name, diff) in enumerate(ordered):
        step = diff.reversed() if reverse else diff
        current = contents[step.path]
        if step.old_path is None and current is not None:
            return DiffFailure(
                step.path, f"{step.path} already exists ({patch_name} creates it)", progress
            )
        if step.old_path is not None and current is None:
            return DiffFailure(
                step.path, f"{step.path} is missing ({patch_name} changes it)", progress
            )
        try:
            updated = apply_hunks(current or b"", step.hunks)
        except HunkMismatchError as error:
            return DiffFailure(
                step.path, f"{step.path}, {error} of {patch_name} does not match", progress
            )
        if step.new_path is None:
            if updated:
                return DiffFailure(
                    step.path, f"{step.path} differs from what {patch_name} created", progress
                )
            contents[step.path] = None
        else:
            contents[step.path] = updated
    return contents
