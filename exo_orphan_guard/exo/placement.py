"""The hooks placed at the anchors of any exo tree, and taken out again byte for byte.

exo's footprint is three things: the files under `exo_tree/` (the hooks module, new
files at the same relative paths), two lines and an import at the top of
`entrypoint` in bootstrap.py, and the same after `logger.info("Starting Worker")`
in `Worker.run`. The stored series fits two exact trees; this puts the same lines
into any tree whose anchors `ast` finds (`anchors`), however its other code moved.

Each block is four lines, `from exo.worker.orphan_guard import X`, a blank line, the
call, a blank line, inserted just before the first non-blank line after the anchor
(after `entrypoint`'s docstring if it has one; after the `logger.info` statement).
So a block is always followed by a line of code or a comment, which exo's
`ruff format` leaves as it is, and the original is recovered by finding the block
at that same place and removing it: the mapping has one inverse, with nothing
stored beside the tree.

Pure: contents in (path: bytes, None: no such file), contents or a `Problem` out.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from . import anchors

EXO_TREE: Final = Path(__file__).resolve().parent / "exo_tree"
"""Files the footprint adds to exo, at their paths relative to this directory."""
HOOKS_IMPORT: Final = "from exo.worker.orphan_guard import"
RUNNER_BLOCK: Final = (
    f"{HOOKS_IMPORT} guard_runner",
    "",
    "guard_runner(bound_instance, task_receiver)",
    "",
)
WORKER_BLOCK: Final = (f"{HOOKS_IMPORT} guard_worker", "", "guard_worker()", "")
HOOKED_FILES: Final = (anchors.ENTRYPOINT_FILE, anchors.WORKER_FILE)
_LINE: Final = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")

PlacedState = Literal["applied", "not applied"]


@final
@dataclass(frozen=True, slots=True)
class Problem:
    """Why the hooks cannot be placed: a missing anchor, or hooks that are partly in."""

    file: str
    reason: str
    anchor: anchors.Missing | None = None


@final
@dataclass(frozen=True, slots=True)
class Placed:
    state: PlacedState
    original: dict[str, bytes | None]
    """The tree without the hooks."""
    patched: dict[str, bytes | None]
    """The tree with them."""


def new_files() -> dict[str, bytes]:
    """Every file under `exo_tree/`, by its path in exo's tree."""
    return {
        path.relative_to(EXO_TREE).as_posix(): path.read_bytes()
        for path in sorted(EXO_TREE.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def files() -> tuple[str, ...]:
    """Every file the footprint touches, in the order the series does."""
    return (*new_files(), *HOOKED_FILES)


def inputs() -> tuple[str, ...]:
    """What `placement` reads: the files it touches, and the one with `Shutdown`."""
    return (*files(), anchors.TASKS_FILE)


def patches() -> tuple[tuple[str, ...], ...]:
    """The files of each patch of the series: the new files, then each hooked file."""
    return (tuple(new_files()), *((path,) for path in HOOKED_FILES))


def placement(contents: Mapping[str, bytes | None]) -> Placed | Problem:
    """Whether the hooks are in `contents` (every file of `inputs()`) and both
    versions of the tree; or why they cannot be placed."""
    added = new_files()
    present = [path for path in added if contents.get(path) is not None]
    blocks: dict[str, tuple[anchors.AnchorName, tuple[str, ...]]] = {
        anchors.ENTRYPOINT_FILE: ("entrypoint", RUNNER_BLOCK),
        anchors.WORKER_FILE: ("Worker.run", WORKER_BLOCK),
    }
    original: dict[str, bytes | None] = {path: None for path in added}
    patched: dict[str, bytes | None] = dict(added)
    found_blocks: list[str] = []
    for path, (name, block) in blocks.items():
        located = _locate(name, contents.get(path))
        if isinstance(located, Problem):
            return located
        text, index, indent = located
        lines = _LINE.findall(text)
        wanted = _block_lines(block, indent, _ending(lines, index))
        if tuple(lines[index : index + len(wanted)]) == wanted:
            found_blocks.append(path)
            original[path] = b"".join(lines[:index] + lines[index + len(wanted) :])
            patched[path] = text
        else:
            if HOOKS_IMPORT.encode() in text or b"orphan_guard" in text:
                return Problem(path, f"{path} has orphan_guard lines where the series puts none")
            original[path] = text
            patched[path] = b"".join([*lines[:index], *wanted, *lines[index:]])
    task = contents.get(anchors.TASKS_FILE)
    shutdown = anchors.shutdown(None if task is None else task.decode("utf-8", "replace"))
    if isinstance(shutdown, anchors.Missing):
        # The runner's hook ends it with exo's own Shutdown task: without one, no place.
        return Problem(shutdown.file, shutdown.describe(), shutdown)
    complete = len(found_blocks) == len(blocks) and len(present) == len(added)
    for path in present:
        if contents[path] != added[path]:
            return Problem(path, f"{path} exists and differs from the one the series adds")
    if complete:
        return Placed("applied", original, patched)
    if found_blocks or present:
        there = ", ".join([*present, *(f"the hook in {path}" for path in found_blocks)])
        return Problem(
            (found_blocks or present)[0], f"the hooks are partly in: {there}, not the rest"
        )
    return Placed("not applied", original, patched)


def _locate(name: anchors.AnchorName, source: bytes | None) -> tuple[bytes, int, str] | Problem:
    """The file, the 0-based line before which the block goes, and the indentation."""
    file = anchors.FILES[name]
    text = None if source is None else source.decode("utf-8", errors="surrogateescape")
    found = anchors.entrypoint(text) if name == "entrypoint" else anchors.worker_run(text)
    if isinstance(found, anchors.Missing):
        return Problem(file, found.describe(), found)
    assert source is not None and text is not None  # found: there is a file
    module = ast.parse(text)
    if name == "entrypoint":
        node = _last_def(module.body, "entrypoint")
        first = node.body[0]
        docstring = (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        )
        lines = _LINE.findall(source)
        if docstring:
            start = first.end_lineno or first.lineno  # the line after the docstring
        else:
            # Back from the first statement over comments and blank lines: the line
            # after the signature's colon.
            start = first.lineno - 1
            while start > node.lineno and _blank_or_comment(lines[start - 1]):
                start -= 1
    else:
        worker = _last_class(module.body, "Worker")
        run = next(
            item
            for item in reversed(worker.body)
            if isinstance(item, ast.AsyncFunctionDef) and item.name == "run"
        )
        start = run.body[0].end_lineno or run.body[0].lineno
        lines = _LINE.findall(source)
    index = start
    while index < len(lines) and not lines[index].strip():
        index += 1
    return source, index, found.indent


def _blank_or_comment(line: bytes) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith(b"#")


def _last_def(body: list[ast.stmt], name: str) -> ast.FunctionDef:
    defined = [node for node in body if isinstance(node, ast.FunctionDef) and node.name == name]
    return defined[-1]


def _last_class(body: list[ast.stmt], name: str) -> ast.ClassDef:
    defined = [node for node in body if isinstance(node, ast.ClassDef) and node.name == name]
    return defined[-1]


def _ending(lines: list[bytes], index: int) -> bytes:
    """The line ending the file uses where the block goes."""
    for line in (*lines[index:], *reversed(lines[:index])):
        for ending in (b"\r\n", b"\n", b"\r"):
            if line.endswith(ending):
                return ending
    return b"\n"


def _block_lines(block: tuple[str, ...], indent: str, ending: bytes) -> tuple[bytes, ...]:
    return tuple((f"{indent}{line}" if line else "").encode() + ending for line in block)
