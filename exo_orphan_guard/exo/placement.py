"""The hooks placed at the anchors of any exo tree, and taken out again byte for byte.

exo's footprint is four things: the files under `exo_tree/` (the hooks module, new
files at the same relative paths), the toggle appended to `shared/constants.py`, two
lines and an import at the top of `entrypoint` in bootstrap.py, and the same before
`while True:` in `Worker.plan_step`. The stored series fits two exact trees; this
puts the same lines into any tree whose anchors `ast` finds (`anchors`), however its
other code moved.

Each block is four lines, `from exo.worker.orphan_guard import X`, a blank line, the
call, a blank line, inserted just before the first non-blank line after the anchor
(after `entrypoint`'s docstring if it has one). So a block is always followed by a
line of code or a comment, which exo's `ruff format` leaves as it is, and the
original is recovered by finding the block at that same place and removing it: the
mapping has one inverse, with nothing stored beside the tree. The toggle is the last
line of constants.py, after the blank lines `ruff format` wants there.

`imports_at_top` moves each block's import up among exo's own imports, as exo writes
them: what the stored series (the pull request against exo main) carries. Placed
into other trees, the imports stay beside the calls, which fits any of them.

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
WORKER_BLOCK: Final = (f"{HOOKS_IMPORT} guard_worker", "", "await guard_worker()", "")
TOGGLE: Final = "EXO_ORPHAN_GUARD"
TOGGLE_LINE: Final = f'{TOGGLE} = os.getenv("{TOGGLE}", "false").lower() in ("true", "1")'
HOOKED_FILES: Final = (anchors.ENTRYPOINT_FILE, anchors.WORKER_FILE)
_HOOKED: Final[dict[str, tuple[anchors.AnchorName, tuple[str, ...]]]] = {
    anchors.ENTRYPOINT_FILE: ("entrypoint", RUNNER_BLOCK),
    anchors.WORKER_FILE: ("Worker.plan_step", WORKER_BLOCK),
}
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
    return (*new_files(), anchors.CONSTANTS_FILE, *HOOKED_FILES)


def inputs() -> tuple[str, ...]:
    """What `placement` reads: the files it touches, and the one with `Shutdown`."""
    return (*files(), anchors.TASKS_FILE)


def patches() -> tuple[tuple[str, ...], ...]:
    """The files of each patch of the series: the new files and the toggle, then each
    hooked file."""
    return ((*new_files(), anchors.CONSTANTS_FILE), *((path,) for path in HOOKED_FILES))


def placement(contents: Mapping[str, bytes | None]) -> Placed | Problem:
    """Whether the hooks are in `contents` (every file of `inputs()`) and both
    versions of the tree; or why they cannot be placed."""
    added = new_files()
    present = [path for path in added if contents.get(path) is not None]
    original: dict[str, bytes | None] = {path: None for path in added}
    patched: dict[str, bytes | None] = dict(added)
    found: list[str] = []
    for path, (name, block) in _HOOKED.items():
        located = _locate(name, contents.get(path))
        if isinstance(located, Problem):
            return located
        text, index, indent = located
        lines = _LINE.findall(text)
        wanted = _block_lines(block, indent, _ending(lines, index))
        if tuple(lines[index : index + len(wanted)]) == wanted:
            found.append(path)
            original[path] = b"".join(lines[:index] + lines[index + len(wanted) :])
            patched[path] = text
        else:
            if b"orphan_guard" in text:
                return Problem(path, f"{path} has orphan_guard lines where the series puts none")
            original[path] = text
            patched[path] = b"".join([*lines[:index], *wanted, *lines[index:]])
    toggle = _toggle(contents.get(anchors.CONSTANTS_FILE))
    if isinstance(toggle, Problem):
        return toggle
    constants_original, constants_patched, toggled = toggle
    original[anchors.CONSTANTS_FILE] = constants_original
    patched[anchors.CONSTANTS_FILE] = constants_patched
    if toggled:
        found.append(anchors.CONSTANTS_FILE)
    task = contents.get(anchors.TASKS_FILE)
    shutdown = anchors.shutdown(None if task is None else task.decode("utf-8", "replace"))
    if isinstance(shutdown, anchors.Missing):
        # The runner's hook ends it with exo's own Shutdown task: without one, no place.
        return Problem(shutdown.file, shutdown.describe(), shutdown)
    for path in present:
        if contents[path] != added[path]:
            return Problem(path, f"{path} exists and differs from the one the series adds")
    if len(found) == len(_HOOKED) + 1 and len(present) == len(added):
        return Placed("applied", original, patched)
    if found or present:
        there = ", ".join([*present, *(f"the hook in {path}" for path in found)])
        return Problem((found or present)[0], f"the hooks are partly in: {there}, not the rest")
    return Placed("not applied", original, patched)


def imports_at_top(placed: Placed) -> Placed | Problem:
    """`placed` with each block's import moved up among the file's own `from exo.`
    imports, where ruff's isort puts it: the shape exo's maintainers write."""
    patched = dict(placed.patched)
    for path, (name, block) in _HOOKED.items():
        source = placed.original[path]
        assert source is not None  # placed: the hooked files are there
        located = _locate(name, source)
        if isinstance(located, Problem):  # pragma: no cover - placement() located it
            return located
        _, index, indent = located
        lines = _LINE.findall(source)
        at = _import_index(path, source, block[0])
        if isinstance(at, Problem):
            return at
        if at > index:
            return Problem(path, f"{path}: exo's imports come after the place of the hook")
        ending = _ending(lines, index)
        call = _block_lines(block[2:], indent, ending)
        moved = [*lines[:at], block[0].encode() + ending, *lines[at:index], *call, *lines[index:]]
        patched[path] = b"".join(moved)
    return Placed(placed.state, placed.original, patched)


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


def _toggle(source: bytes | None) -> tuple[bytes, bytes, bool] | Problem:
    """constants.py (original, with the toggle, whether it is in): the toggle is its
    last line, after one blank line, or two where the code before ends in a `def` or
    a `class` (as `ruff format` wants)."""
    file = anchors.CONSTANTS_FILE
    text = None if source is None else source.decode("utf-8", errors="surrogateescape")
    found = anchors.constants(text)
    if isinstance(found, anchors.Missing):
        return Problem(file, found.describe(), found)
    assert source is not None and text is not None  # found: there is a file
    lines = _LINE.findall(source)
    ending = _ending(lines, len(lines))
    toggle = TOGGLE_LINE.encode() + ending
    if source.endswith(ending + toggle):
        original = source[: -len(toggle)].rstrip(b"\r\n") + ending
        if _toggled(original, ending) == source:
            return original, source, True
    if TOGGLE.encode() in source:
        return _no_place(f"{file} already has {TOGGLE}, not as the series' last line")
    if not lines or not lines[-1].endswith(ending) or not lines[-1].strip():
        return _no_place(f"{file} does not end in one line ending after its code")
    return source, _toggled(source, ending), False


def _toggled(original: bytes, ending: bytes) -> bytes:
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
    return original + ending * blank + TOGGLE_LINE.encode() + ending


def _no_place(detail: str) -> Problem:
    missing = anchors.Missing("constants", anchors.CONSTANTS_FILE, "no place", detail)
    return Problem(anchors.CONSTANTS_FILE, missing.describe(), missing)


def _locate(name: anchors.AnchorName, source: bytes | None) -> tuple[bytes, int, str] | Problem:
    """The file, the 0-based line before which the block goes, and the indentation."""
    file = anchors.FILES[name]
    text = None if source is None else source.decode("utf-8", errors="surrogateescape")
    found = anchors.entrypoint(text) if name == "entrypoint" else anchors.worker_plan_step(text)
    if isinstance(found, anchors.Missing):
        return Problem(file, found.describe(), found)
    assert source is not None and text is not None  # found: there is a file
    module = ast.parse(text)
    lines = _LINE.findall(source)
    if name == "entrypoint":
        node: ast.FunctionDef | ast.AsyncFunctionDef = _last_def(module.body, "entrypoint")
    else:
        worker = _last_class(module.body, "Worker")
        node = next(
            item
            for item in reversed(worker.body)
            if isinstance(item, ast.AsyncFunctionDef) and item.name == "plan_step"
        )
    first = node.body[0]
    docstring = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    if docstring:
        start = first.end_lineno or first.lineno  # the line after the docstring
    else:
        # Back from the first statement over comments and blank lines: the line after
        # the signature's colon.
        start = first.lineno - 1
        while start > node.lineno and _blank_or_comment(lines[start - 1]):
            start -= 1
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
