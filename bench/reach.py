"""`make reach EXO_SRC=<exo git dir>`: which exo trees `patch apply` reaches.

    python -m bench.reach --exo-src DIR [--step 10] [--from v1.0.61] [--to main]
        [--results bench/results/reach.jsonl] [--python313 PATH] [--no-plot]
    python -m bench.reach --exo-src FORK_GIT_DIR --only REV [--only REV ...]
        --results bench/results/reach-forks.jsonl   (a fork's heads, no history walk)

Walks exo's first-parent history from `--from` to `--to` (`git rev-list
--first-parent FROM^..TO`), every `--step`th commit (the first, and `--to`, always),
plus every release tag between them (some sit on release branches, off the
first-parent line). For each: `git archive` into a temporary directory; the anchors
(`exo_orphan_guard.exo.anchors`); `exo-orphan-guard patch apply --no-lock` as a
user runs it, both series (`--with-package`: the PR, and the local series on top);
where it applies, the hooks present, the changed Python files compiled
by Python 3.13 (`py_compile`, its cache kept out of the tree), `ruff check` and
`ruff format --check` of the changed files with the ruff the tree's own `uv.lock`
pins (installed once per version under `.cache/ruff/`) and that tree's config, and
`patch revert` giving back the tree byte for byte. One JSON line per commit goes to the results
file as soon as it is measured, keyed by commit and a fingerprint of the package
code that decides (the series, the patch machinery, the anchors): a run resumes
where the last stopped, and a changed series measures everything again. Then the
table (`bench.reach_table`) is printed and written beside the results, and the
picture (`bench.plot_reach`) drawn.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, TypedDict, cast

from exo_orphan_guard.exo import anchors, bugfix, patching, placement

from .reach_commits import Commit, git_output, heads, select
from .reach_ruff import pinned_ruff, ruff_findings

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "reach.jsonl"
SCHEMA: Final = "exo-orphan-guard/reach/2"
HOOKS: Final = (
    # (file, text): each module, hook and import both series write, whatever the shape.
    (placement.RECORDS_MODULE, "def record_runner("),
    (placement.WATCH_MODULE, "def watch_parent("),
    (placement.SWEEP_MODULE, "async def end_leftover_runners("),
    (placement.LOCAL_MODULE, "async def guard_worker("),
    (anchors.WORKER_FILE, "from exo.worker.runner.leftover_runners import end_leftover_runners\n"),
    (anchors.WORKER_FILE, "await end_leftover_runners()\n"),
    (anchors.WORKER_FILE, "from exo.worker.orphan_guard import guard_worker\n"),
    (anchors.WORKER_FILE, "await guard_worker()\n"),
    *((anchors.CONSTANTS_FILE, f"{line}\n") for line in placement.SETTINGS),
)
RUNNER_HOOKS: Final = {
    # The runner's hook, by the shape of the tree's runner.
    placement.WORK_QUEUE.name: (
        anchors.RUNNER_FILE,
        "watch_parent(self.bound_instance, self._work_queue.put)\n",
    ),
    placement.RELAY.name: (
        anchors.ENTRYPOINT_FILE,
        "task_receiver = relay_tasks(bound_instance, task_receiver)\n",
    ),
}
HOOKED_FILES: Final = (
    anchors.ENTRYPOINT_FILE,
    anchors.RUNNER_FILE,
    anchors.WORKER_FILE,
    anchors.CONSTANTS_FILE,
)
_DECIDING: Final = (
    "anchors.py",
    "patching.py",
    "patch_format.py",
    "patch_command.py",
    "placement.py",
    "footprints.py",
    "format_patch.py",
)


class AnchorResult(TypedDict):
    anchor: str
    found: bool
    where: str
    """`file:line`, or the reason it is missing and what differs."""


class Record(TypedDict):
    schema: str
    fingerprint: str
    commit: str
    date: str
    first_parent_index: int | None
    release: str | None
    describe: str
    anchors: list[AnchorResult]
    apply_exit: int
    apply_line: str
    """What `patch apply` said first (stdout where it applied, else its error)."""
    hooks: bool | None
    compiles: bool | None
    ruff: str | None
    """The ruff version the tree's uv.lock pins (None: no pin)."""
    ruff_clean: bool | None
    """`ruff check` and `ruff format --check` of the changed files find nothing the
    pristine files did not have already (None: not run)."""
    ruff_preexisting: bool | None
    """The pristine files already had findings (a fork that does not run exo's ruff)."""
    ruff_output: str
    runner_hook: str | None
    """Where the runner's hook went: `work queue` (exo's runner has its own task queue)
    or `relay` (it reads the worker's stream itself); None: not applied."""
    revert_exact: bool | None
    reached: bool
    """Applied, hooks present, compiled, ruff clean, reverted byte for byte."""
    seconds: float


def fingerprint() -> str:
    """What decides a result: the stored series and the code that applies them."""
    digest = hashlib.sha256(SCHEMA.encode())
    exo = Path(anchors.__file__).parent
    for path in sorted(patching.PATCHES_DIR.rglob("*.patch")):
        if path.is_relative_to(bugfix.BUGFIX_DIR):
            continue  # never applied by `patch apply`
        digest.update(path.relative_to(patching.PATCHES_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    for relative, content in placement.every_new_file().items():
        digest.update(relative.encode())
        digest.update(content)
    for name in _DECIDING:
        digest.update((exo / name).read_bytes())
    return digest.hexdigest()[:16]


def measure(
    exo_src: Path,
    commit: Commit,
    work: Path,
    python313: str,
    print_: str,
    paths: Sequence[str] = (),
) -> Record:
    """One tree, from `git archive` to `patch revert`; `work` is emptied after."""
    started = time.monotonic()
    tree = work / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(exo_src), "archive", commit.sha, *paths], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    ruff_version = pinned_ruff(tree)
    found = anchors.find(tree)
    before = tree_digest(tree)
    touched = [path for path in HOOKED_FILES if (tree / path).is_file()]
    pristine_ruff = None
    if ruff_version and touched:
        pristine_ruff = ruff_findings(ruff_version, tree, touched)
    environment = {**os.environ, "XDG_STATE_HOME": str(work / "state")}  # the undo record
    applied = _cli(tree, "apply", "--no-lock", "--with-package", environment=environment)
    hooks = compiles = revert_exact = ruff_clean = ruff_preexisting = None
    runner_hook = None
    ruff = ruff_version
    ruff_output = ""
    if applied.returncode == 0:
        after = tree_digest(tree)
        runner_hook = next(
            (name for name, (file, text) in RUNNER_HOOKS.items() if text in _read(tree / file)),
            None,
        )
        hooks = runner_hook is not None and all(text in _read(tree / file) for file, text in HOOKS)
        changed = sorted(
            path for path in after if path.endswith(".py") and after[path] != before.get(path)
        )
        # The cache prefix keeps __pycache__ out of the tree, which must revert exactly.
        compiled = subprocess.run(
            [python313, "-m", "py_compile", *changed],
            cwd=tree,
            stdin=subprocess.DEVNULL,  # with no file named, py_compile would read stdin
            env={
                **environment,
                "PYENV_VERSION": "3.13.0",
                "PYTHONPYCACHEPREFIX": str(work / "pyc"),
            },
            capture_output=True,
            check=False,
        )
        compiles = bool(changed) and compiled.returncode == 0
        if ruff is not None:
            after = ruff_findings(ruff, tree, changed)
            ruff_output = "\n".join(after.findings)
            # Only what the hooks add counts: a fork that does not run exo's ruff has
            # findings of its own, the same before and after.
            had: set[str] = set(pristine_ruff.findings) if pristine_ruff else set()
            ruff_preexisting = bool(had)
            ruff_clean = set(after.findings) <= had
        reverted = _cli(tree, "revert", environment=environment)
        revert_exact = reverted.returncode == 0 and tree_digest(tree) == before
    # Without the temporary path, a record reads the same from one run to the next.
    output = (applied.stdout if applied.returncode == 0 else applied.stderr).strip()
    output = output.replace(str(tree), "<tree>")
    record = Record(
        schema=SCHEMA,
        fingerprint=print_,
        commit=commit.sha,
        date=commit.date,
        first_parent_index=commit.index,
        release=commit.release,
        describe=git_output(
            exo_src, "describe", "--tags", "--always", "--match", "v[0-9]*", commit.sha
        ).strip(),
        anchors=[_anchor_result(anchor) for anchor in found],
        apply_exit=applied.returncode,
        apply_line=output.splitlines()[0] if output else "",
        hooks=hooks,
        compiles=compiles,
        ruff=ruff,
        ruff_clean=ruff_clean,
        ruff_preexisting=ruff_preexisting,
        ruff_output=ruff_output.replace(str(tree), "<tree>")[:400],
        runner_hook=runner_hook,
        revert_exact=revert_exact,
        reached=bool(
            applied.returncode == 0
            and hooks
            and compiles
            and ruff_clean is not False
            and revert_exact
        ),
        seconds=round(time.monotonic() - started, 2),
    )
    shutil.rmtree(work)
    return record


def tree_digest(tree: Path) -> dict[str, str]:
    """Every file's sha256 by its path: equal digests, byte-for-byte equal trees."""
    return {
        path.relative_to(tree).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(tree.rglob("*"))
        if path.is_file() or path.is_symlink()
    }


def load(results: Path, print_: str) -> dict[str, Record]:
    """The records measured with this fingerprint, by commit (later lines win)."""
    kept: dict[str, Record] = {}
    if results.is_file():
        for line in results.read_text().splitlines():
            if not line.strip():
                continue
            record = cast(Record, json.loads(line))
            if record.get("schema") == SCHEMA and record.get("fingerprint") == print_:
                kept[record["commit"]] = record
    return kept


def run(
    exo_src: Path,
    start: str,
    end: str,
    step: int,
    results: Path,
    python313: str,
    only: Sequence[str] = (),
    paths: Sequence[str] = (),
) -> list[Record]:
    commits = heads(exo_src, only) if only else select(exo_src, start, end, step)
    print_ = fingerprint()
    done = load(results, print_)
    results.parent.mkdir(parents=True, exist_ok=True)
    # Records of another series or code say nothing about this one: dropped, so the
    # file holds one line per commit.
    results.write_text("".join(json.dumps(record) + "\n" for record in done.values()))
    todo = [commit for commit in commits if commit.sha not in done]
    print(f"reach: {len(commits)} trees, {len(commits) - len(todo)} cached ({results})")
    with results.open("a") as out, tempfile.TemporaryDirectory(prefix="eog-reach-") as scratch:
        for number, commit in enumerate(todo, start=1):
            record = measure(exo_src, commit, Path(scratch) / commit.sha, python313, print_, paths)
            out.write(json.dumps(record) + "\n")
            out.flush()
            done[commit.sha] = record
            name = commit.release or record["describe"]
            verdict = "reached" if record["reached"] else "not reached"
            print(f"  {number}/{len(todo)} {commit.sha[:10]} {name}: {verdict}", flush=True)
    return [done[commit.sha] for commit in commits]


def _anchor_result(anchor: anchors.Anchor) -> AnchorResult:
    if isinstance(anchor, anchors.Found):
        return AnchorResult(anchor=anchor.anchor, found=True, where=f"{anchor.file}:{anchor.line}")
    return AnchorResult(
        anchor=anchor.anchor, found=False, where=f"{anchor.reason}: {anchor.detail}"
    )


def _cli(
    tree: Path, *arguments: str, environment: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "exo_orphan_guard",
            "patch",
            arguments[0],
            "--exo",
            str(tree),
            *arguments[1:],
        ],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _python313() -> str:
    prefix = subprocess.run(
        ["pyenv", "prefix", "3.13.0"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return f"{prefix}/bin/python3.13" if prefix else "python3.13"


def main(argv: Iterable[str] | None = None) -> int:
    from . import reach_table

    parser = argparse.ArgumentParser(
        prog="python -m bench.reach", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--exo-src", type=Path, required=True, help="a git clone of exo")
    parser.add_argument("--step", type=int, default=10, help="every Nth first-parent commit")
    parser.add_argument("--from", dest="start", default="v1.0.61")
    parser.add_argument("--to", dest="end", default="main")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--python313", default=_python313())
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--only", action="append", default=[], help="measure this revision alone (repeat)"
    )
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        help="archive only these paths (a mirror without some large blobs: src, uv.lock, ...)",
    )
    arguments = parser.parse_args(None if argv is None else list(argv))
    if arguments.step < 1:
        parser.error("--step must be 1 or more")
    if shutil.which(arguments.python313) is None:
        parser.error(f"no Python 3.13 at {arguments.python313!r} (make reach PYTHON313=...)")
    records = run(
        arguments.exo_src,
        arguments.start,
        arguments.end,
        arguments.step,
        arguments.results,
        arguments.python313,
        arguments.only,
        arguments.path,
    )
    if arguments.only:
        for record in records:
            print(json.dumps({key: record[key] for key in ("commit", "describe", "reached")}))
        return 0
    command = f"make reach EXO_SRC=<exo clone> STEP={arguments.step}"
    if (arguments.start, arguments.end) != ("v1.0.61", "main"):
        command = f"python -m bench.reach --from {arguments.start} --to {arguments.end} ..."
    table = reach_table.render(records, arguments.step, command, arguments.end)
    print(table)
    arguments.results.with_suffix(".md").write_text(table)
    if not arguments.no_plot:
        from . import plot_reach

        plot_reach.draw(records, plot_reach.DEFAULT_IMAGE, command)
        print(f"picture: {plot_reach.DEFAULT_IMAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
