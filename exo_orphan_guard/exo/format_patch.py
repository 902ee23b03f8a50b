"""`git format-patch` files written in Python: a series for the tree at hand.

`patch export` writes what `patch apply` does to a tree as the stored series would
say it, when the stored series does not fit that tree: each patch keeps the stored
patch's message (author, date, subject, body) and gets the diff of its own files
computed from the tree. The diffs are git's (`diff --git`, blob ids on the `index`
line, three lines of context, git's default hunk-header function names), so
`git am` takes them and `git am -3` can fall back on the blobs.

Pure but for reading the stored messages.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, final

CONTEXT: Final = 3
MODE: Final = "100644"
_SUBJECT: Final = re.compile(rb"^(Subject: \[PATCH )\d+/\d+(\] )", re.MULTILINE)
_FUNCNAME: Final = re.compile(rb"^[A-Za-z_$]")
_NO_NEWLINE: Final = b"\\ No newline at end of file\n"


@final
@dataclass(frozen=True, slots=True)
class Change:
    path: str
    old: bytes | None
    """None: the patch creates the file."""
    new: bytes | None
    """None: the patch deletes the file."""

    @property
    def counts(self) -> tuple[int, int]:
        """(lines added, lines removed)."""
        added = removed = 0
        old, new = _lines(self.old), _lines(self.new)
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "equal":
                removed += i2 - i1
                added += j2 - j1
        return added, removed


def blob_id(content: bytes | None) -> str:
    """git's object id of a blob (all zeros: no file)."""
    if content is None:
        return "0" * 40
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def file_diff(change: Change) -> bytes:
    """`git diff` of one file, as git writes it in a patch."""
    path = change.path
    old_id, new_id = blob_id(change.old)[:7], blob_id(change.new)[:7]
    out = [f"diff --git a/{path} b/{path}\n".encode()]
    if change.old is None:
        out += [f"new file mode {MODE}\n".encode(), f"index {old_id}..{new_id}\n".encode()]
    elif change.new is None:
        out += [f"deleted file mode {MODE}\n".encode(), f"index {old_id}..{new_id}\n".encode()]
    else:
        out.append(f"index {old_id}..{new_id} {MODE}\n".encode())
    out.append(b"--- /dev/null\n" if change.old is None else f"--- a/{path}\n".encode())
    out.append(b"+++ /dev/null\n" if change.new is None else f"+++ b/{path}\n".encode())
    out += _hunks(_lines(change.old), _lines(change.new))
    return b"".join(out)


def diffstat(changes: Sequence[Change]) -> bytes:
    """The summary `git format-patch` writes under `---`."""
    counts = [change.counts for change in changes]
    width = max(len(change.path) for change in changes)
    digits = max(len(str(added + removed)) for added, removed in counts)
    largest = max(added + removed for added, removed in counts) or 1
    room = max(72 - width - digits - 4, 10)
    lines: list[str] = []
    for change, (added, removed) in zip(changes, counts, strict=True):
        scale = min(1.0, room / largest)
        plus, minus = round(added * scale), round(removed * scale)
        bar = "+" * plus + "-" * minus
        lines.append(f" {change.path.ljust(width)} | {str(added + removed).rjust(digits)} {bar}")
    total_added = sum(added for added, _ in counts)
    total_removed = sum(removed for _, removed in counts)
    summary = f" {len(changes)} file{'s' if len(changes) != 1 else ''} changed"
    if total_added:
        summary += f", {total_added} insertion{'s' if total_added != 1 else ''}(+)"
    if total_removed:
        summary += f", {total_removed} deletion{'s' if total_removed != 1 else ''}(-)"
    lines.append(summary)
    lines += [f" create mode {MODE} {change.path}" for change in changes if change.old is None]
    lines += [f" delete mode {MODE} {change.path}" for change in changes if change.new is None]
    return ("\n".join(lines) + "\n").encode()


def message_of(patch: bytes) -> bytes:
    """A stored patch's header and message: everything before its `---` line."""
    head, separator, _ = patch.partition(b"\n---\n")
    if not separator:
        raise ValueError("not a git format-patch file (no '---' line)")
    return head + b"\n"


def patch(message: bytes, number: int, total: int, changes: Sequence[Change]) -> bytes:
    """One format-patch file: `message` (from `message_of`), numbered `number/total`."""
    numbered = _SUBJECT.sub(rb"\g<1>%d/%d\g<2>" % (number, total), message, count=1)
    diffs = b"".join(file_diff(change) for change in changes)
    return numbered + b"---\n" + diffstat(changes) + b"\n" + diffs


def with_diffstat(cover: bytes, changes: Sequence[Change]) -> bytes:
    """A cover letter with its diffstat (the lines from the first ` path | N` to the
    `N files changed` line) replaced by that of `changes`."""
    lines = cover.splitlines(keepends=True)
    stat = re.compile(rb"^ \S.* \| +\d+")
    start = next((i for i, line in enumerate(lines) if stat.match(line)), None)
    if start is None:
        return cover
    end = next(
        (i for i in range(start, len(lines)) if b" changed" in lines[i] and b"file" in lines[i]),
        start,
    )
    while end + 1 < len(lines) and lines[end + 1].startswith((b" create mode", b" delete mode")):
        end += 1
    return b"".join([*lines[:start], diffstat(changes), *lines[end + 1 :]])


def changes_between(
    before: Mapping[str, bytes | None], after: Mapping[str, bytes | None], paths: Sequence[str]
) -> list[Change]:
    return [
        Change(path, before.get(path), after.get(path))
        for path in paths
        if before.get(path) != after.get(path)
    ]


def _lines(content: bytes | None) -> list[bytes]:
    return [] if content is None else content.splitlines(keepends=True)


def _hunks(old: list[bytes], new: list[bytes]) -> list[bytes]:
    ops = _slid(_script(old, new))
    changed = [index for index, (kind, _) in enumerate(ops) if kind != b" "]
    out: list[bytes] = []
    groups: list[list[int]] = []
    for index in changed:
        if groups and index - groups[-1][-1] <= 2 * CONTEXT:
            groups[-1].append(index)
        else:
            groups.append([index])
    # Where each op starts in the old and new files.
    old_at: list[int] = []
    new_at: list[int] = []
    old_line = new_line = 0
    for kind, _ in ops:
        old_at.append(old_line)
        new_at.append(new_line)
        old_line += kind != b"+"
        new_line += kind != b"-"
    for group in groups:
        first = max(0, group[0] - CONTEXT)
        last = min(len(ops), group[-1] + CONTEXT + 1)
        chunk = ops[first:last]
        old_count = sum(kind != b"+" for kind, _ in chunk)
        new_count = sum(kind != b"-" for kind, _ in chunk)
        old_range = _range(old_at[first], old_at[first] + old_count)
        new_range = _range(new_at[first], new_at[first] + new_count)
        header = f"@@ -{old_range} +{new_range} @@".encode()
        name = _function_name(old, old_at[first])
        out.append(header + (b" " + name if name else b"") + b"\n")
        for kind, line in chunk:
            out += _marked(kind, [line])
    return out


def _script(old: list[bytes], new: list[bytes]) -> list[tuple[bytes, bytes]]:
    """Line by line: (b" ", kept), (b"-", removed), (b"+", added)."""
    ops: list[tuple[bytes, bytes]] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            ops += [(b" ", line) for line in old[i1:i2]]
        else:
            ops += [(b"-", line) for line in old[i1:i2]]
            ops += [(b"+", line) for line in new[j1:j2]]
    return ops


def _slid(ops: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Each run of only added (or only removed) lines moved as far down as the same
    diff allows, as git places an ambiguous run (a blank line added next to one)."""
    ops = list(ops)
    index = 0
    while index < len(ops):
        kind = ops[index][0]
        if kind == b" ":
            index += 1
            continue
        end = index
        while end < len(ops) and ops[end][0] == kind:
            end += 1
        while end < len(ops) and ops[end][0] == b" " and ops[end][1] == ops[index][1]:
            ops[index], ops[end] = (b" ", ops[index][1]), (kind, ops[end][1])
            index += 1
            end += 1
        index = end
    return ops


def _marked(prefix: bytes, lines: Sequence[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for line in lines:
        if line.endswith(b"\n"):
            out.append(prefix + line)
        else:
            out += [prefix + line + b"\n", _NO_NEWLINE]
    return out


def _range(start: int, stop: int) -> str:
    """A unified-diff range as git writes it: `l,s`, `l` for one line, `l-1,0` for none."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def _function_name(old: Sequence[bytes], before: int) -> bytes:
    """git's default: the nearest line above the hunk that starts with a letter, `_` or
    `$`, without its line end and trailing blanks, at most 80 bytes."""
    for line in reversed(old[:before]):
        if _FUNCNAME.match(line):
            return line.rstrip()[:80]
    return b""
