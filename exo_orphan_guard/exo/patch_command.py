"""`exo-orphan-guard patch check|apply|revert|export --exo PATH [--source SRC] [--no-lock]
[--with-package] [--out DIR]`.

The PR series (`patching`) puts exo's own guard into exo and leaves `pyproject.toml`
alone. The local series, the package's part inside exo, goes on top where the package
will be there: with `--with-package`, with `--source`, or with the package installed
in the tree's `.venv`;
`--source` adds, in this tree, the `orphan-guard` extra and the `[tool.uv.sources]`
entry that makes it resolve (`uv_project`), then `uv lock` when uv is on PATH, with
an undo record so revert restores `pyproject.toml` and `uv.lock` byte for byte.

`export` writes the series for the tree (`git format-patch` files and the cover
letter): the stored one where it applies as it is, else one computed for the tree
(`format_patch`), so that `git am` of it gives what `apply` gives.

Exit codes: check: 0 applied, 1 not applied; apply/revert: 0 done or nothing to do (a
lock that failed or could not run is a line saying what to run); export: 0 written;
2 not an exo tree, an anchor missing, hooks partly in (the error's first line says
which and where, the next ones why and what to do), a bad --source, or an --out that
cannot be written (nothing changed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal

from .._version import __version__
from . import format_patch, patching, placement, uv_project
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
    with_package: bool = False,
) -> int:
    try:
        match action:
            case "check":
                return _check(tree, say)
            case "export":
                return _export(tree, out, say, with_package=with_package)
            case "apply":
                chosen = None if source is None else uv_project.validate_source(source)
                local = with_package or chosen is not None or installed_in(tree)
                return _apply(tree, chosen, lock, say, with_package=local)
            case "revert":
                return _revert(tree, say)
    except (patching.PatchError, uv_project.SourceError) as error:
        details = error.details if isinstance(error, patching.PatchError) else ()
        raise PatchCommandError(
            "\n".join([str(error), *(f"  {line}" for line in details)])
        ) from error


def installed_in(tree: Path) -> bool:
    """Whether exo-orphan-guard is installed in the exo tree's own `.venv`."""
    return any((tree / ".venv").glob("lib/python3*/site-packages/exo_orphan_guard-*.dist-info"))


def _check(tree: Path, say: Callable[[str], None]) -> int:
    status = patching.check(tree)
    say(f"series {status.series.label} fits {tree}: {status.state}")
    say(f"local series (the package's part inside exo): {status.with_package}")
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


def _apply(
    tree: Path,
    source: Source | None,
    lock: bool,
    say: Callable[[str], None],
    *,
    with_package: bool,
) -> int:
    status = patching.check(tree)  # raises before anything is written
    undo = uv_project.read_undo(tree)
    fresh = status.state == "not applied"
    original_lock = _read(tree / LOCK)
    original_pyproject = _read(tree / PYPROJECT)
    if fresh:
        # A record left from an earlier, since reverted, round no longer applies.
        undo = {}
    before = status
    status, changed = patching.apply(tree, with_package=with_package)
    files = len(status.series.files)
    done = "applied" if before.state == "not applied" else "already applied: nothing changed"
    say(f"series {status.series.label} ({files} files) {done} in {tree}")
    if status.local is not None:
        done = "applied" if before.local is None else "already applied"
        say(f"local series {status.local.label} (the package's part inside exo): {done}")
    else:
        say(
            "local series: not applied (the package is not in the tree's .venv; "
            "--with-package or --source adds it)"
        )
    del changed

    pyproject = _read(tree / PYPROJECT) or b""
    if source is not None:
        updated = uv_project.with_extra(uv_project.with_source(pyproject, source))
        if updated != pyproject:
            _write(tree / PYPROJECT, updated)
            before = undo[PYPROJECT].before if PYPROJECT in undo else pyproject
            undo[PYPROJECT] = Saved(before, digest(updated))
        say(f"source: {source.path} ({source.kind}), with the orphan-guard extra")
    else:
        declared = uv_project.declared_source(pyproject)
        if declared is None:
            say(f"source: none: {_no_source_advice(tree)}")
        else:
            say(f"source: {declared} (kept)")

    if source is None and _read(tree / PYPROJECT) == original_pyproject:
        # Nothing uv reads changed: the lock is as current as it was.
        say("uv.lock: nothing to lock (pyproject.toml is unchanged)")
        uv_project.write_undo(tree, undo)
        return EXIT_OK
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
    local = status.local is not None
    applied = status.state == "applied"
    status, _ = patching.revert(tree)
    files = len(status.series.files)
    if local:
        say("local series (the package's part inside exo) reverted")
    done = "reverted" if applied else "not applied: nothing to revert"
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


def _export(
    tree: Path, out: Path | None, say: Callable[[str], None], *, with_package: bool = False
) -> int:
    try:
        status = patching.check(tree)
    except patching.PatchError as error:
        name, why = patching.chosen_for(tree)
        say(f"series {name}: {why}")
        say(f"state in {tree}: does not apply as it is ({error}): rebase it with git am -3")
        files = _stored(name)
        local = _stored(name, patching.WITH_PACKAGE_DIR) if with_package else []
        default = name
    else:
        if status.series.name == patching.PLACED:
            say(
                f"series {patching.PLACED}: {tree} is not an exo the stored series was "
                "written for: the same hooks, placed at its anchors"
            )
            files = _generated(tree)
            local = _generated_local(tree) if with_package else []
            default = patching.PLACED
        else:
            name, why = patching.chosen_for(tree)
            say(f"series {name}: {why}")
            files = _stored(name)
            local = _stored(name, patching.WITH_PACKAGE_DIR) if with_package else []
            default = name
        say(f"state in {tree}: {status.state} (series {status.series.label})")
    target = (out or Path(f"orphan-guard-{default}")).expanduser().resolve()
    try:
        target.mkdir(parents=True, exist_ok=True)
        for file_name, content in files:
            patching.write_atomically(target / file_name, content)
        if local:
            (target / "with-package").mkdir(exist_ok=True)
        for file_name, content in local:
            patching.write_atomically(target / "with-package" / file_name, content)
    except OSError as error:
        raise patching.PatchError(f"cannot write {error.filename}: {error.strerror}") from error
    say(f"wrote {len(files)} files to {target}")
    say(f"to apply them as commits: git -C {tree} am {target}/000[1-9]-*.patch")
    if local:
        say(
            f"and the local series (never for exo's PR): git -C {tree} am "
            f"{target}/with-package/000[1-9]-*.patch"
        )
    return EXIT_OK


def _stored(name: str, root: Path = patching.PATCHES_DIR) -> list[tuple[str, bytes]]:
    directory = root / name
    cover = (
        [directory / patching.COVER_LETTER] if (directory / patching.COVER_LETTER).exists() else []
    )
    files = [*cover, *patching.patch_files(directory)]
    return [(file.name, file.read_bytes()) for file in files]


TEMPLATES: Final = {placement.WORK_QUEUE.name: "main", placement.RELAY.name: "v1.0.71"}
"""Whose stored messages a series computed for a tree keeps, by its footprint."""


def _generated(tree: Path, *, imports_at_top: bool = False) -> list[tuple[str, bytes]]:
    """The PR for `tree` as it is: the stored patches' messages, this tree's diffs.
    With `imports_at_top` (how the stored series is written), the imports go among
    exo's own; else beside the calls, as `apply` places them."""
    placed = patching.footprint(tree)
    if imports_at_top:
        at_top = placement.imports_at_top(placed)
        if isinstance(at_top, placement.Problem):
            raise patching.PatchError(at_top.reason)
        placed = at_top
    template = dict(_stored(TEMPLATES[placed.footprint.name]))
    return _series(placed, template, with_cover=True)


def _generated_local(tree: Path, *, imports_at_top: bool = False) -> list[tuple[str, bytes]]:
    """The local series for `tree`, on top of the PR as `apply` places it (with
    `imports_at_top`, as the stored PR has it)."""
    with_pr = patching.footprint(tree)
    if imports_at_top:
        at_top = placement.imports_at_top(with_pr)
        if isinstance(at_top, placement.Problem):
            raise patching.PatchError(at_top.reason)
        with_pr = at_top
    contents = {path: _read(tree / path) for path in placement.inputs()}
    contents.update(with_pr.patched)
    placed = placement.placement(contents, placement.WITH_PACKAGE)
    if isinstance(placed, placement.Problem):
        raise patching.PatchError(placed.reason)
    template = dict(_stored("main", patching.WITH_PACKAGE_DIR))
    return _series(placed, template, with_cover=False)


def _series(
    placed: placement.Placed, template: dict[str, bytes], *, with_cover: bool
) -> list[tuple[str, bytes]]:
    groups = placed.footprint.patches
    names = patching.patch_names(placed.footprint)
    patches: list[tuple[str, bytes]] = []
    every: list[format_patch.Change] = []
    for number, (name, paths) in enumerate(zip(names, groups, strict=True), 1):
        changes = format_patch.changes_between(placed.original, placed.patched, paths)
        every += changes
        message = format_patch.message_of(template[name])
        patches.append((name, format_patch.patch(message, number, len(groups), changes)))
    if not with_cover:
        return patches
    cover = format_patch.with_diffstat(
        template[patching.COVER_LETTER], sorted(every, key=lambda change: change.path)
    )
    return [(patching.COVER_LETTER, cover), *patches]


def _no_source_advice(tree: Path) -> str:
    where = suggested_source()
    return (
        f"exo's uv project does not name exo-orphan-guard: run exo with it (uv run --with "
        f"{where} exo), or add it as a source and extra in this tree: exo-orphan-guard "
        f"patch apply --exo {tree} --source {where}"
    )


def suggested_source() -> str:
    """This checkout, when the CLI runs from one; else what it was installed from
    (`uv tool install ~/src/exo-orphan-guard`: that checkout); else where a wheel
    would be."""
    checkout = Path(__file__).resolve().parents[2]
    try:
        uv_project.validate_source(checkout)
    except uv_project.SourceError:
        installed = uv_project.installed_from(uv_project.recorded_direct_url())
        if installed is None:
            return f"/path/to/exo_orphan_guard-{__version__}-py3-none-any.whl"
        return str(installed)
    return str(checkout)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _write(path: Path, content: bytes) -> None:
    patching.write_atomically(path, content)
