"""`exo-orphan-guard patch check|apply|revert|export --exo PATH [--source SRC] [--no-lock]
[--out DIR]`.

The series (`patching`) puts the hooks and the `orphan-guard` extra into exo; this
module adds what makes that extra resolve in exo's uv project (`uv_project`): the
`[tool.uv.sources]` entry for `--source`, `uv lock` when uv is on PATH, and an undo
record so revert restores `pyproject.toml` and `uv.lock` byte for byte.

`export` writes the series for the tree's exo version (`git format-patch` files and
the cover letter) for review, `git am` or a rebase onto a newer exo.

Exit codes: check: 0 applied, 1 not applied; apply/revert: 0 done or nothing to do (a
lock that failed or could not run is a line saying what to run); export: 0 written;
2 not an exo tree, no series fits, a tree the series does not apply to (the error's
first line says where, the next ones why and what to do), a bad --source, or an --out
that cannot be written (nothing changed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal

from .._version import __version__
from . import patching, uv_project
from .uv_project import LOCK, PYPROJECT, Saved, Source, digest

EXIT_OK: Final = 0
EXIT_LEFT: Final = 1

Action = Literal["check", "apply", "revert", "export"]


class PatchCommandError(Exception):
    """One line for the operator, then any details indented; nothing was changed."""


def run(
    action: Action,
    tree: Path,
    source: Path | None,
    *,
    lock: bool = True,
    out: Path | None = None,
    say: Callable[[str], None] = print,
) -> int:
    try:
        match action:
            case "check":
                return _check(tree, say)
            case "export":
                return _export(tree, out, say)
            case "apply":
                chosen = None if source is None else uv_project.validate_source(source)
                return _apply(tree, chosen, lock, say)
            case "revert":
                return _revert(tree, say)
    except (patching.PatchError, uv_project.SourceError) as error:
        details = error.details if isinstance(error, patching.PatchError) else ()
        raise PatchCommandError(
            "\n".join([str(error), *(f"  {line}" for line in details)])
        ) from error


def _check(tree: Path, say: Callable[[str], None]) -> int:
    status = patching.check(tree)
    say(f"series {status.series.label} fits {tree}: {status.state}")
    pyproject = _read(tree / PYPROJECT) or b""
    declared = uv_project.declared_source(pyproject)
    if declared is None:
        say(f"source: none: {_no_source_advice(tree)}")
    elif not Path(declared).exists():
        say(f"source: {declared} is missing: {_no_source_advice(tree)}")
    else:
        say(f"source: {declared}")
    state, line = uv_project.lock_state(tree, uv_project.find_uv())
    say(_lock_check_line(tree, state, line))
    if (record := uv_project.undo_record(tree)) is not None:
        say(f"undo record: {record} (what revert puts back)")
    return EXIT_OK if status.state == "applied" else EXIT_LEFT


def _lock_check_line(tree: Path, state: uv_project.LockState, line: str) -> str:
    match state:
        case "current":
            return f"uv.lock: current ({line})"
        case "stale":
            return f"uv.lock: stale: run: cd {tree} && uv lock"
        case "unknown":
            return f"uv.lock: cannot tell: uv lock --check says: {line}"
        case "no uv.lock":
            return f"uv.lock: none in {tree}"
        case "no uv":
            return "uv.lock: not checked (uv is not on PATH)"


def _apply(tree: Path, source: Source | None, lock: bool, say: Callable[[str], None]) -> int:
    status = patching.check(tree)  # raises before anything is written
    undo = uv_project.read_undo(tree)
    fresh = status.state == "not applied"
    original_lock = _read(tree / LOCK)
    if fresh:
        # A record left from an earlier, since reverted, round no longer applies.
        undo = {}
    status, changed = patching.apply(tree)
    files = len(status.series.files)
    done = "applied" if changed else "already applied: nothing changed"
    say(f"series {status.series.name} ({files} files) {done} in {tree}")

    pyproject = _read(tree / PYPROJECT) or b""
    if source is not None:
        updated = uv_project.with_source(pyproject, source)
        if updated != pyproject:
            _write(tree / PYPROJECT, updated)
            before = undo[PYPROJECT].before if PYPROJECT in undo else pyproject
            undo[PYPROJECT] = Saved(before, digest(updated))
        say(f"source: {source.path} ({source.kind})")
    else:
        declared = uv_project.declared_source(pyproject)
        if declared is None:
            say(f"source: none: {_no_source_advice(tree)}")
        else:
            say(f"source: {declared} (kept)")

    if original_lock is not None and LOCK not in undo and (fresh or source is not None):
        undo[LOCK] = Saved(original_lock, digest(original_lock))
    _lock(tree, lock, undo, say)
    uv_project.write_undo(tree, undo)
    return EXIT_OK


def _lock(tree: Path, lock: bool, undo: dict[str, Saved], say: Callable[[str], None]) -> None:
    """Lock, or say in one line why not and what to run: the patch is in either way, so
    `apply` still succeeds (its exit code says whether the patch is in, as before)."""
    if not (tree / LOCK).is_file():
        say(f"uv.lock: none in {tree}: nothing to lock")
        return
    run_it = f"run: cd {tree} && uv lock"
    uv = uv_project.find_uv()
    if not lock or uv is None:
        why = "--no-lock" if not lock else "uv is not on PATH"
        say(f"uv.lock: not updated ({why}); until it is, `uv run exo` re-locks: {run_it}")
        return
    result = uv_project.run_uv(uv, tree, "lock")
    if LOCK in undo:
        undo[LOCK] = Saved(undo[LOCK].before, digest(_read(tree / LOCK)))
    if result.ok:
        say(f"uv.lock: locked ({result.line})")
    else:
        failed = f"uv.lock: uv lock failed, the patch stays applied: {result.line}"
        say(f"{failed}; fix that, then {run_it}")


def _revert(tree: Path, say: Callable[[str], None]) -> int:
    status = patching.check(tree)  # raises before anything is written
    undo = uv_project.read_undo(tree)
    if PYPROJECT in undo:
        current = _read(tree / PYPROJECT)
        saved = undo[PYPROJECT]
        if digest(current) == saved.after_sha256 and saved.before is not None:
            _write(tree / PYPROJECT, saved.before)
            say("source: exo-orphan-guard entry removed")
        else:
            say(
                "source: pyproject.toml changed after apply: its exo-orphan-guard entry "
                "is left as it is"
            )
    elif uv_project.declared_source(_read(tree / PYPROJECT) or b"") is not None:
        say(
            f"source: no record of what apply changed ({uv_project.undo_path(tree)}): the "
            "exo-orphan-guard entry in pyproject.toml is left as it is"
        )
    status, changed = patching.revert(tree)
    files = len(status.series.files)
    done = "reverted" if changed else "not applied: nothing to revert"
    say(f"series {status.series.label} ({files} files) {done} in {tree}")
    if LOCK in undo:
        saved = undo[LOCK]
        if digest(_read(tree / LOCK)) == saved.after_sha256 and saved.before is not None:
            _write(tree / LOCK, saved.before)
            say("uv.lock: restored as it was before apply")
        else:
            say(f"uv.lock: changed after apply, left as it is: run: cd {tree} && uv lock")
    uv_project.write_undo(tree, {})
    return EXIT_OK


def _export(tree: Path, out: Path | None, say: Callable[[str], None]) -> int:
    name, why = patching.chosen_for(tree)
    say(f"series {name}: {why}")
    try:
        status = patching.check(tree)
        state = f"{status.state} (series {status.series.label})"
    except patching.PatchError as error:
        state = f"does not apply as it is ({error}): rebase it with git am -3"
    say(f"state in {tree}: {state}")
    directory = patching.PATCHES_DIR / name
    files = [directory / patching.COVER_LETTER, *patching.patch_files(directory)]
    target = (out or Path(f"orphan-guard-{name}")).expanduser().resolve()
    try:
        target.mkdir(parents=True, exist_ok=True)
        for file in files:
            patching.write_atomically(target / file.name, file.read_bytes())
    except OSError as error:
        raise patching.PatchError(f"cannot write {error.filename}: {error.strerror}") from error
    say(f"wrote {len(files)} files to {target}")
    say(f"to apply them as commits: git -C {tree} am {target}/000[1-9]-*.patch")
    return EXIT_OK


def _no_source_advice(tree: Path) -> str:
    return (
        "the orphan-guard extra resolves only once exo-orphan-guard is on your package "
        f"index; until then run: exo-orphan-guard patch apply --exo {tree} "
        f"--source {suggested_source()}"
    )


def suggested_source() -> str:
    """This checkout, when the CLI runs from one; else where a wheel would be."""
    checkout = Path(__file__).resolve().parents[2]
    try:
        uv_project.validate_source(checkout)
    except uv_project.SourceError:
        return f"/path/to/exo_orphan_guard-{__version__}-py3-none-any.whl"
    return str(checkout)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _write(path: Path, content: bytes) -> None:
    patching.write_atomically(path, content)
