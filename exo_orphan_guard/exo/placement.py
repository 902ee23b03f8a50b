"""The series placed at the anchors of any exo tree, and taken out again byte for byte.

A footprint (`footprints`) is the files a series adds, its hooks and its settings.
Each hook's four lines go just before the first non-blank line after its anchor
(after a docstring if there is one). So a block is always followed by a line of code
or a comment, which exo's `ruff format` leaves as it is, and the original is
recovered by finding the block at that same place and removing it: the mapping has
one inverse, with nothing stored beside the tree. The settings are the last lines of
constants.py, after the blank lines `ruff format` wants there.

`imports_at_top` moves each block's import up among exo's own imports, as exo writes
them: what the stored PR carries. Placed into other trees, the imports stay beside
the calls, which fits any of them.

Pure: contents in (path: bytes, None: no such file), contents or a `Problem` out.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, final

from . import anchors
from .footprints import (
    EXO_TREE,
    EXO_TREE_WITH_PACKAGE,
    LOCAL_MODULE,
    RECORDS_MODULE,
    RELAY,
    RELAY_MODULE,
    SETTINGS,
    SWEEP_MODULE,
    TOGGLE,
    TOGGLE_LINE,
    WATCH_MODULE,
    WITH_PACKAGE,
    WORK_QUEUE,
    Footprint,
    Hook,
)

__all__ = [
    "EXO_TREE",
    "EXO_TREE_WITH_PACKAGE",
    "LOCAL_MODULE",
    "RECORDS_MODULE",
    "RELAY",
    "RELAY_MODULE",
    "SETTINGS",
    "SWEEP_MODULE",
    "TOGGLE",
    "TOGGLE_LINE",
    "WATCH_MODULE",
    "WITH_PACKAGE",
    "WORK_QUEUE",
    "Footprint",
    "Hook",
    "Placed",
    "Problem",
]

PlacedState = Literal["applied", "not applied"]

_LINE: Final = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


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
    """The tree without the footprint."""
    patched: dict[str, bytes | None]
    """The tree with it."""
    footprint: Footprint = WORK_QUEUE


def new_files(footprint: Footprint = WORK_QUEUE) -> dict[str, bytes]:
    """The files `footprint` adds, by their path in exo's tree."""
    return {path: (footprint.root / path).read_bytes() for path in footprint.added}


def every_new_file() -> dict[str, bytes]:
    """Every file either footprint of the PR, or the local series, adds."""
    found: dict[str, bytes] = {}
    for footprint in (WORK_QUEUE, RELAY, WITH_PACKAGE):
        found.update(new_files(footprint))
    return found


def pr_footprint(contents: Mapping[str, bytes | None]) -> Footprint:
    """The PR's shape for a tree: its runner's own task queue, or the relay."""
    source = contents.get(anchors.RUNNER_FILE)
    text = None if source is None else source.decode("utf-8", errors="surrogateescape")
    return WORK_QUEUE if anchors.runner_main(text).found else RELAY


def inputs() -> tuple[str, ...]:
    """What `placement` may read, for any footprint."""
    paths = [
        *(path for footprint in (WORK_QUEUE, RELAY, WITH_PACKAGE) for path in footprint.files),
        anchors.TASKS_FILE,
        anchors.ENTRYPOINT_FILE,
        anchors.RUNNER_FILE,
    ]
    return tuple(dict.fromkeys(paths))


def placement(contents: Mapping[str, bytes | None], footprint: Footprint) -> Placed | Problem:
    """Whether `footprint` is in `contents` (every file of `inputs()`; for the local
    series, a tree with the PR in) and both versions of the tree; or why it cannot be
    placed."""
    if footprint.settings:
        for name in anchors.REQUIRED:
            found = _anchor(name, contents)
            if isinstance(found, anchors.Missing):
                return Problem(found.file, found.describe(), found)
    added = new_files(footprint)
    present = [path for path in added if contents.get(path) is not None]
    original: dict[str, bytes | None] = {path: None for path in added}
    patched: dict[str, bytes | None] = dict(added)
    found_in: list[str] = []
    for hook in footprint.hooks:
        located = _locate(hook.anchor, contents.get(hook.file))
        if isinstance(located, Problem):
            return located
        text, index, indent = located
        lines = _LINE.findall(text)
        wanted = _block_lines(hook.block, indent, _ending(lines, index))
        if tuple(lines[index : index + len(wanted)]) == wanted:
            found_in.append(hook.file)
            original[hook.file] = b"".join(lines[:index] + lines[index + len(wanted) :])
            patched[hook.file] = text
        else:
            if _hooked_elsewhere(hook, text):
                return Problem(
                    hook.file, f"{hook.file} has the series' lines where the series puts none"
                )
            original[hook.file] = text
            patched[hook.file] = b"".join([*lines[:index], *wanted, *lines[index:]])
    expected = len(footprint.hooks)
    if footprint.settings:
        settings = _settings(contents.get(anchors.CONSTANTS_FILE), footprint.settings)
        if isinstance(settings, Problem):
            return settings
        constants_original, constants_patched, settled = settings
        original[anchors.CONSTANTS_FILE] = constants_original
        patched[anchors.CONSTANTS_FILE] = constants_patched
        expected += 1
        if settled:
            found_in.append(anchors.CONSTANTS_FILE)
    for path in present:
        if contents[path] != added[path]:
            return Problem(path, f"{path} exists and differs from the one the series adds")
    if len(found_in) == expected and len(present) == len(added):
        return Placed("applied", original, patched, footprint)
    if found_in or present:
        there = ", ".join([*present, *(f"the hook in {path}" for path in found_in)])
        return Problem((found_in or present)[0], f"the hooks are partly in: {there}, not the rest")
    return Placed("not applied", original, patched, footprint)


def _hooked_elsewhere(hook: Hook, text: bytes) -> bool:
    """Whether the hook's own import or call is anywhere in `text`."""
    return any(line.encode() in text for line in hook.block if line)


def _anchor(name: anchors.AnchorName, contents: Mapping[str, bytes | None]) -> anchors.Anchor:
    source = contents.get(anchors.FILES[name])
    text = None if source is None else source.decode("utf-8", errors="surrogateescape")
    return anchors.LOCATORS[name](text)


def imports_at_top(placed: Placed) -> Placed | Problem:
    """`placed` with each block's import moved up among the file's own `from exo.`
    imports, where ruff's isort puts it: the shape exo's maintainers write."""
    patched = dict(placed.patched)
    for hook in placed.footprint.hooks:
        if not hook.import_at_top:
            continue
        source = placed.original[hook.file]
        assert source is not None  # placed: the hooked files are there
        located = _locate(hook.anchor, source)
        if isinstance(located, Problem):  # pragma: no cover - placement() located it
            return located
        _, index, indent = located
        lines = _LINE.findall(source)
        at = _import_index(hook.file, source, hook.block[0])
        if isinstance(at, Problem):
            return at
        if at > index:
            return Problem(
                hook.file, f"{hook.file}: exo's imports come after the place of the hook"
            )
        ending = _ending(lines, index)
        call = _block_lines(hook.block[2:], indent, ending)
        moved = [
            *lines[:at],
            hook.block[0].encode() + ending,
            *lines[at:index],
            *call,
            *lines[index:],
        ]
        patched[hook.file] = b"".join(moved)
    return Placed(placed.state, placed.original, patched, placed.footprint)


def _import_index(path: str, source: bytes, line: str) -> int | Problem:
    """The 0-based line before which `line` (`from exo.x import y`) goes: right after
    the last top-level `from exo.` import whose module sorts before it, else before
    the first one."""
    module = line.split()[1]
    tree = ast.parse(source.decode("utf-8", errors="surrogateescape"))
    exo_imports = [
        node
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        and node.level == 0
        and node.module is not None
        and node.module.split(".")[0] == "exo"
    ]
    if not exo_imports:
        return Problem(path, f"{path} has no top-level `from exo.` import to sort beside")
    before = [node for node in exo_imports if node.module is not None and node.module < module]
    if before:
        return before[-1].end_lineno or before[-1].lineno
    return exo_imports[0].lineno - 1


def _settings(
    source: bytes | None, settings: tuple[str, ...]
) -> tuple[bytes, bytes, bool] | Problem:
    """constants.py (original, with the settings, whether they are in): they are its
    last lines, after one blank line, or two where the code before ends in a `def` or
    a `class` (as `ruff format` wants)."""
    file = anchors.CONSTANTS_FILE
    text = None if source is None else source.decode("utf-8", errors="surrogateescape")
    found = anchors.constants(text)
    if isinstance(found, anchors.Missing):
        return Problem(file, found.describe(), found)
    assert source is not None and text is not None  # found: there is a file
    lines = _LINE.findall(source)
    ending = _ending(lines, len(lines))
    block = b"".join(line.encode() + ending for line in settings)
    if source.endswith(ending + block):
        original = source[: -len(block)].rstrip(b"\r\n") + ending
        if _settled(original, ending, block) == source:
            return original, source, True
    if TOGGLE.encode() in source:
        return _no_place(f"{file} already has {TOGGLE}, not as the series' last lines")
    if not lines or not lines[-1].endswith(ending) or not lines[-1].strip():
        return _no_place(f"{file} does not end in one line ending after its code")
    return source, _settled(source, ending, block), False


def _settled(original: bytes, ending: bytes, block: bytes) -> bytes:
    module = ast.parse(original.decode("utf-8", errors="surrogateescape"))
    last: ast.stmt | None = module.body[-1] if module.body else None
    while last is not None and not isinstance(last, ast.FunctionDef | ast.AsyncFunctionDef):
        if isinstance(last, ast.ClassDef):
            break
        body: list[ast.stmt] = [
            *getattr(last, "body", []),
            *getattr(last, "orelse", []),
            *getattr(last, "finalbody", []),
        ]
        handlers = getattr(last, "handlers", [])
        ends = [*body, *(handler.body[-1] for handler in handlers if handler.body)]
        last = max(ends, key=lambda node: node.end_lineno or node.lineno) if ends else None
    blank = 2 if last is not None else 1
    return original + ending * blank + block


def _no_place(detail: str) -> Problem:
    missing = anchors.Missing("constants", anchors.CONSTANTS_FILE, "no place", detail)
    return Problem(anchors.CONSTANTS_FILE, missing.describe(), missing)


def _locate(name: anchors.AnchorName, source: bytes | None) -> tuple[bytes, int, str] | Problem:
    """The file, the 0-based line before which the block goes, and the indentation."""
    file = anchors.FILES[name]
    text = None if source is None else source.decode("utf-8", errors="surrogateescape")
    found = anchors.LOCATORS[name](text)
    if isinstance(found, anchors.Missing):
        return Problem(file, found.describe(), found)
    assert source is not None and text is not None  # found: there is a file
    module = ast.parse(text)
    lines = _LINE.findall(source)
    body = _body(name, module)
    first = body[0]
    docstring = (
        name != "entrypoint"
        and isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    if docstring:
        start = first.end_lineno or first.lineno  # the line after the docstring
    else:
        # Back from the first statement over comments and blank lines: the line after
        # the colon that opens the body.
        opener = _opener(name, module)
        start = first.lineno - 1
        while start > opener and _blank_or_comment(lines[start - 1]):
            start -= 1
    index = start
    while index < len(lines) and not lines[index].strip():
        index += 1
    return source, index, found.indent


def _body(name: anchors.AnchorName, module: ast.Module) -> list[ast.stmt]:
    if name == "entrypoint":
        entrypoint = _last_def(module.body, "entrypoint")
        guarded = anchors.try_after_logger(entrypoint.body)
        assert guarded is not None  # the anchor was found
        return guarded.body
    return _method(name, module).body


def _opener(name: anchors.AnchorName, module: ast.Module) -> int:
    """The 1-based line of the statement whose body the block opens."""
    if name == "entrypoint":
        guarded = anchors.try_after_logger(_last_def(module.body, "entrypoint").body)
        assert guarded is not None
        return guarded.lineno
    return _method(name, module).lineno


def _method(name: anchors.AnchorName, module: ast.Module) -> ast.FunctionDef | ast.AsyncFunctionDef:
    owner, method = name.split(".")
    cls = _last_class(module.body, owner)
    return next(
        item
        for item in reversed(cls.body)
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == method
    )


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
