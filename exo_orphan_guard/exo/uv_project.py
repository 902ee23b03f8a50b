"""exo's uv project around the patch series: where `exo-orphan-guard` comes from, and
`uv.lock`.

exo is a uv project whose `uv.lock` resolves every extra. The series adds no extra
(one naming a package on no index breaks `uv lock` for everyone); `--source` adds,
in this tree only, the `orphan-guard` extra and the `[tool.uv.sources]` entry (a
wheel, an sdist or a checkout) that makes it resolve. The pure
functions here decide what the files become; `undo` records what apply changed so
revert can put `pyproject.toml` and `uv.lock` back byte for byte. The record lives
where `git status` never shows it: in the checkout's git directory, or, for a tree
that is not a git checkout, under the user's state directory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast, final

from .patching import write_atomically

PACKAGE: Final = "exo-orphan-guard"
SOURCES_HEADER: Final = b"[tool.uv.sources]"
EXTRAS_HEADER: Final = b"[project.optional-dependencies]"
EXTRA_LINE: Final = b'orphan-guard = ["exo-orphan-guard"]\n'
_EXTRA_KEY: Final = re.compile(rb"^\s*[\"']?orphan-guard[\"']?\s*=")
PYPROJECT: Final = "pyproject.toml"
LOCK: Final = "uv.lock"
UNDO_NAME: Final = "orphan-guard-undo.json"
"""What apply's source entry and `uv lock` replaced (`undo_path`)."""
UV_TIMEOUT_SECONDS: Final = 600.0
_KEY_LINE: Final = re.compile(rb"^exo-orphan-guard\s*=")
_DIST_NAME: Final = re.compile(r"^exo[_-]orphan[_-]guard-\d", re.IGNORECASE)

SourceKind = Literal["wheel", "sdist", "checkout"]
LockState = Literal["current", "stale", "unknown", "no uv.lock", "no uv"]


class SourceError(ValueError):
    """A --source that is not a wheel, an sdist or a checkout of exo-orphan-guard."""


@final
@dataclass(frozen=True, slots=True)
class Source:
    path: Path
    kind: SourceKind

    def entry_line(self) -> bytes:
        # A JSON string is a valid TOML basic string: quotes and backslashes escaped.
        return f"{PACKAGE} = {{ path = {json.dumps(str(self.path))} }}\n".encode()


def validate_source(raw: Path) -> Source:
    """The absolute source, or SourceError saying what is wrong with it."""
    path = raw.expanduser().resolve()
    if not path.exists():
        raise SourceError(f"--source {raw}: no such file or directory")
    if path.is_dir():
        name = _project_name(path / PYPROJECT)
        if name != PACKAGE:
            found = f"its pyproject.toml names {name!r}" if name else "it has no pyproject.toml"
            raise SourceError(f"--source {path}: not a checkout of {PACKAGE} ({found})")
        return Source(path, "checkout")
    if path.suffix == ".whl" and _DIST_NAME.match(path.name) and zipfile.is_zipfile(path):
        return Source(path, "wheel")
    if path.name.endswith(".tar.gz") and _DIST_NAME.match(path.name) and tarfile.is_tarfile(path):
        return Source(path, "sdist")
    raise SourceError(
        f"--source {path}: not a wheel (exo_orphan_guard-*.whl), an sdist "
        f"(exo_orphan_guard-*.tar.gz) or a checkout of {PACKAGE}"
    )


def _project_name(pyproject: Path) -> str | None:
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    name = _table(data, "project").get("name")
    return name if isinstance(name, str) else None


def _table(parent: Mapping[str, object], key: str) -> Mapping[str, object]:
    """`parent[key]` if it is a table, else an empty one."""
    value = parent.get(key)
    return cast("dict[str, object]", value) if isinstance(value, dict) else {}


def declared_source(pyproject: bytes) -> str | None:
    """What `[tool.uv.sources]` says about exo-orphan-guard, as written; None: nothing."""
    try:
        data = tomllib.loads(pyproject.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    sources = _table(_table(_table(data, "tool"), "uv"), "sources")
    if PACKAGE not in sources:
        return None
    path = _table(sources, PACKAGE).get("path")
    return path if isinstance(path, str) else json.dumps(sources[PACKAGE])


def with_source(pyproject: bytes, source: Source) -> bytes:
    """`pyproject` with exactly one exo-orphan-guard entry in `[tool.uv.sources]`, the
    table created at the end if there is none."""
    lines = pyproject.splitlines(keepends=True)
    start = _table_start(lines)
    if start is None:
        separator = b"" if not pyproject or pyproject.endswith(b"\n") else b"\n"
        return pyproject + separator + b"\n" + SOURCES_HEADER + b"\n" + source.entry_line()
    end = _table_end(lines, start)
    for index in range(start + 1, end):
        if _KEY_LINE.match(lines[index]):
            lines[index] = source.entry_line()
            return b"".join(lines)
    lines.insert(start + 1, source.entry_line())
    return b"".join(lines)


def with_extra(pyproject: bytes) -> bytes:
    """`pyproject` with the `orphan-guard` extra, added at the end of
    `[project.optional-dependencies]` (the table created at the end if there is none);
    as it is if the extra is there."""
    lines = pyproject.splitlines(keepends=True)
    start = _table_start(lines, EXTRAS_HEADER)
    if start is None:
        separator = b"" if not pyproject or pyproject.endswith(b"\n") else b"\n"
        return pyproject + separator + b"\n" + EXTRAS_HEADER + b"\n" + EXTRA_LINE
    end = _table_end(lines, start)
    if any(_EXTRA_KEY.match(line) for line in lines[start + 1 : end]):
        return pyproject
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    if not lines[end - 1].endswith(b"\n"):
        lines[end - 1] += b"\n"
    lines.insert(end, EXTRA_LINE)
    return b"".join(lines)


def _table_start(lines: list[bytes], header: bytes = SOURCES_HEADER) -> int | None:
    for index, line in enumerate(lines):
        if line.strip() == header:
            return index
    return None


def _table_end(lines: list[bytes], start: int) -> int:
    for index in range(start + 1, len(lines)):
        if lines[index].lstrip().startswith(b"["):
            return index
    return len(lines)


# --- the undo record ------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Saved:
    """A file's bytes before apply changed it (None: it did not exist), and a digest of
    what apply left: revert restores `before` only while the file is still that."""

    before: bytes | None
    after_sha256: str


def digest(content: bytes | None) -> str:
    return "" if content is None else hashlib.sha256(content).hexdigest()


def git_directory(tree: Path) -> Path | None:
    """The git directory of a checkout rooted at `tree` (`.git`, or the directory a
    worktree's `.git` file names), or None."""
    dot_git = tree / ".git"
    if dot_git.is_dir():
        return dot_git
    try:
        line = dot_git.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not line.startswith("gitdir:"):
        return None
    named = Path(line.removeprefix("gitdir:").strip())
    directory = named if named.is_absolute() else tree / named
    return directory if directory.is_dir() else None


def undo_path(tree: Path) -> Path:
    """Where apply keeps its record for `tree`: never in its work tree."""
    git = git_directory(tree)
    if git is not None:
        return git / UNDO_NAME
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if state else Path.home() / ".local" / "state"
    key = hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:16]
    return base / PACKAGE / "undo" / f"{key}.json"


def undo_record(tree: Path) -> Path | None:
    """The record apply left for `tree`, if there is one."""
    path = undo_path(tree)
    return path if path.is_file() else None


def read_undo(tree: Path) -> dict[str, Saved]:
    """The record apply left; empty if there is none or it is unreadable (then revert
    leaves both files as they are and says so)."""
    try:
        raw = json.loads(undo_path(tree).read_text())
    except (OSError, ValueError):
        return {}
    return _parse_undo(raw)


def _parse_undo(raw: object) -> dict[str, Saved]:
    saved: dict[str, Saved] = {}
    record = _table({"record": raw}, "record")
    for name in (PYPROJECT, LOCK):
        entry = _table(record, name)
        before = entry.get("before")
        after = entry.get("after_sha256")
        if (before is None or isinstance(before, str)) and isinstance(after, str):
            try:
                content = None if before is None else base64.b64decode(before, validate=True)
            except ValueError:  # not base64: not a record this package wrote
                continue
            saved[name] = Saved(content, after)
    return saved


def write_undo(tree: Path, saved: Mapping[str, Saved]) -> None:
    """Keep `saved` for revert (none: forget it)."""
    target = undo_path(tree)
    if not saved:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        name: {
            "before": None if entry.before is None else base64.b64encode(entry.before).decode(),
            "after_sha256": entry.after_sha256,
        }
        for name, entry in saved.items()
    }
    write_atomically(target, (json.dumps(payload, indent=1) + "\n").encode())


# --- uv -------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class UvResult:
    ok: bool
    line: str
    """uv's own summary or first error line."""
    output: str = ""


def find_uv() -> str | None:
    return shutil.which("uv")


def run_uv(uv: str, tree: Path, *arguments: str) -> UvResult:
    try:
        finished = subprocess.run(
            [uv, *arguments],
            cwd=tree,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=UV_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return UvResult(False, f"uv {' '.join(arguments)} took over {UV_TIMEOUT_SECONDS:g} s")
    except OSError as error:
        return UvResult(False, f"cannot run {uv}: {error.strerror}")
    output = finished.stdout + finished.stderr
    ok = finished.returncode == 0
    return UvResult(ok, summary_line(output, ok=ok), output)


def summary_line(output: str, *, ok: bool) -> str:
    """The line that says what happened: the first error line; else, for a run that
    failed, its first line (the cause comes first: pyenv's shim for a `uv` it cannot
    find says `pyenv: uv: command not found`, then advice), for one that worked, its
    last (uv's summary)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith("error:"):
            return line
    if not lines:
        return "(no output)"
    return lines[-1] if ok else lines[0]


def lock_state(tree: Path, uv: str | None) -> tuple[LockState, str]:
    """Whether `uv.lock` matches `pyproject.toml`, by `uv lock --check`."""
    if not (tree / LOCK).is_file():
        return "no uv.lock", ""
    if uv is None:
        return "no uv", ""
    result = run_uv(uv, tree, "lock", "--check")
    if result.ok:
        return "current", result.line
    if "needs to be updated" in result.output:
        return "stale", result.line
    # uv could not resolve (an unreachable host, a missing package): it cannot say.
    return "unknown", result.line
