"""Why `patch` refuses a tree, told as it is.

Release 0.1.0 called every tree its series did not fit "conflicting local edits",
which sent users of a pristine exo (another release, a fork) looking for edits they
never made. Such a tree now gets the hooks at its anchors (`placement`); what is
refused is a tree without an anchor, or with the hooks partly in. A refusal says
which anchor in which file (or which hunk, for a stored series), which anchors the
tree has (`anchors`), which exo it is (`git describe`) and what to do; and "local
edits" only where git says the files the hooks touch differ from the tree's own HEAD.

`gather` asks git (effects); `compose` decides the words (pure).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from . import anchors as anchors_module
from .anchors import Anchor

GIT_SECONDS: Final = 10.0
Direction = Literal["apply", "revert"]
GitKind = Literal["git", "not git", "git failed"]


@final
@dataclass(frozen=True, slots=True)
class Mismatch:
    """Where the stored series stopped matching the tree."""

    series: str
    written_for: str
    """The exo the series was written for, e.g. `main (b5375f8cee43)`."""
    direction: Direction
    """The direction that got further: `revert` for a tree the series is in, then
    edited; `apply` otherwise."""
    path: str
    reason: str
    """The file, the hunk and the patch, e.g. `src/..., hunk 1 (@@ ...) of 0002-... does
    not match`; or the anchor that is missing and why."""
    kind: Literal["hunk", "anchor", "partial"] = "hunk"
    """`anchor`: an anchor the hooks need is missing (`reason` describes it);
    `partial`: the hooks are in the tree, but not all or not as placed."""


@final
@dataclass(frozen=True, slots=True)
class GitFacts:
    kind: GitKind
    version: str = ""
    """`git describe --tags --always`, for a git tree."""
    edited: tuple[str, ...] = ()
    """`git status --porcelain` lines for the files the series touches."""
    problem: str = ""
    """Why git could not answer (kind `git failed`)."""
    head_fits: bool | None = None
    """Where there are local edits: whether the series applies to the files as HEAD
    has them (the edits set aside); None: not asked, or git could not say."""

    @property
    def edited_paths(self) -> frozenset[str]:
        # Porcelain v1: two status letters, a space, the path (a rename: `old -> new`).
        return frozenset(line[3:].split(" -> ")[-1] for line in self.edited)


@final
@dataclass(frozen=True, slots=True)
class Refusal:
    line: str
    details: tuple[str, ...]


Fits = Callable[[Mapping[str, bytes | None]], bool]
"""Whether the series applies to these contents (path: bytes, None: no such file)."""


def gather(tree: Path, files: Sequence[str], fits: Fits | None = None) -> GitFacts:
    """What git says about `tree`: its version and its local edits in `files`, and,
    where there are some and `fits` is given, whether the series fits the files as
    HEAD has them. Only a checkout rooted at `tree` counts (a tree unpacked inside
    another repository is not that repository's exo). Reads only:
    `--no-optional-locks` keeps `git status` from rewriting the index."""
    if not (tree / ".git").exists():  # a directory, or a worktree's file
        return GitFacts("not git")
    try:
        top = _git(tree, "rev-parse", "--show-toplevel")
        if top.returncode == 0 and Path(top.stdout.strip()).resolve() != tree.resolve():
            return GitFacts("not git")
        described = _git(tree, "describe", "--tags", "--always")
        status = _git(tree, "--no-optional-locks", "status", "--porcelain", "--", *files)
    except (OSError, subprocess.SubprocessError) as error:
        return GitFacts("git failed", problem=str(error).splitlines()[0])
    if described.returncode != 0 or status.returncode != 0:
        failed = described if described.returncode != 0 else status
        lines = failed.stderr.strip().splitlines() or [f"exit code {failed.returncode}"]
        return GitFacts("git failed", problem=lines[-1])
    edited = tuple(line for line in status.stdout.splitlines() if line.strip())
    head_fits = None
    if edited and fits is not None:
        head = head_contents(tree, files)
        head_fits = None if head is None else fits(head)
    return GitFacts("git", described.stdout.strip(), edited, head_fits=head_fits)


def head_contents(tree: Path, files: Sequence[str]) -> dict[str, bytes | None] | None:
    """`files` as the tree's HEAD has them (None: not in HEAD); None if git fails."""
    try:
        listed = _git(tree, "ls-tree", "-r", "--name-only", "HEAD", "--", *files)
        if listed.returncode != 0:
            return None
        present = set(listed.stdout.splitlines())
        contents: dict[str, bytes | None] = {}
        for path in files:
            if path not in present:
                contents[path] = None
                continue
            shown = subprocess.run(
                ["git", "-C", str(tree), "show", f"HEAD:{path}"],
                capture_output=True,
                timeout=GIT_SECONDS,
                check=False,
            )
            if shown.returncode != 0:
                return None
            contents[path] = shown.stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return contents


def compose(tree: Path, mismatch: Mismatch, found: Sequence[Anchor], facts: GitFacts) -> Refusal:
    """The refusal's first line (what did not match, and in which kind of tree), then
    one line each: local edits, exo's version, every anchor, what to do."""
    # The edits are in the way where the series fits HEAD; where git could not say,
    # where they touch the file that does not match.
    edits_at_fault = facts.head_fits is True or (
        facts.head_fits is None and mismatch.path in facts.edited_paths
    )
    which = f"exo {facts.version} at {tree}" if facts.kind == "git" else f"the exo tree at {tree}"
    if mismatch.kind == "anchor" and edits_at_fault:
        head = f"the hooks have no place in the local edits in {which}"
    elif mismatch.kind == "anchor":
        head = f"the hooks have no place in {which}"
    elif mismatch.kind == "partial":
        head = f"the hooks are in {which} but do not come out again"
    elif mismatch.direction == "revert":
        head = f"series {mismatch.series} is in {which} but does not come out again"
    elif edits_at_fault:
        head = f"series {mismatch.series} does not apply to local edits in {which}"
    else:
        head = f"series {mismatch.series} does not fit {which}"
    line = f"{head}: {mismatch.reason}; nothing changed"
    details = [
        _edits_line(facts, edits_at_fault),
        _version_line(facts),
        *(f"anchor {anchor.describe()}" for anchor in found),
        _advice(tree, mismatch, found, facts, edits_at_fault),
    ]
    return Refusal(line, tuple(details))


def version_and_anchors(tree: Path) -> tuple[str, ...]:
    """The lines a refusal without a hunk adds (no series fits the tree at all)."""
    facts = gather(tree, ())
    return (_version_line(facts), *(f"anchor {a.describe()}" for a in _required(tree)))


def refuse(tree: Path, mismatch: Mismatch, files: Sequence[str], fits: Fits) -> Refusal:
    return compose(tree, mismatch, _required(tree), gather(tree, files, fits))


def _required(tree: Path) -> tuple[Anchor, ...]:
    """The anchors every tree needs (`Runner.main` only picks where the runner's hook
    goes)."""
    return tuple(a for a in anchors_module.find(tree) if a.anchor in anchors_module.REQUIRED)


def _edits_line(facts: GitFacts, at_fault: bool) -> str:
    match facts.kind:
        case "not git":
            return "local edits: cannot tell (not a git tree)"
        case "git failed":
            return f"local edits: cannot tell (git: {facts.problem})"
        case "git":
            if not facts.edited:
                return (
                    "local edits: none (the files the series touches are as the tree's git "
                    "HEAD has them): this is another exo, not an edited one"
                )
            where = "" if at_fault else " (not what stops the series)"
            listed = "; ".join(line.strip() for line in facts.edited)
            match facts.head_fits:
                case True:
                    head = "; the series applies to the files as HEAD has them"
                case False:
                    head = "; it would not apply to the files as HEAD has them either"
                case None:
                    head = ""
            return f"local edits{where}: {listed} (git status --porcelain){head}"


def _version_line(facts: GitFacts) -> str:
    match facts.kind:
        case "git":
            return f"exo version: {facts.version} (git describe --tags)"
        case "not git":
            return "exo version: unknown (not a git tree)"
        case "git failed":
            return f"exo version: unknown (git: {facts.problem})"


def _advice(
    tree: Path,
    mismatch: Mismatch,
    found: Sequence[Anchor],
    facts: GitFacts,
    edits_at_fault: bool,
) -> str:
    lost = [anchor.anchor for anchor in found if not anchor.found]
    if mismatch.direction == "revert":
        return (
            f"what to do: the hooks' lines in {mismatch.path} were changed after apply; "
            f"put them back as the series wrote them (git -C {tree} diff -- {mismatch.path} "
            "shows them in a git tree), then revert"
        )
    if edits_at_fault:
        return (
            f"what to do: set the edits aside (git -C {tree} stash), apply, then "
            f"git -C {tree} stash pop and resolve what conflicts"
        )
    rebase = (
        f"exo-orphan-guard patch export --exo {tree} --out DIR, then "
        f"git -C {tree} am -3 DIR/000[1-9]-*.patch and resolve"
    )
    meanwhile = "meanwhile `exo-orphan-guard sweep` ends orphans without any patch"
    if lost:
        return (
            f"what to do: this tree lacks {', '.join(lost)}, which every exo since v1.0.61 "
            f"has: the hooks have no place here; {meanwhile}"
        )
    return (
        f"what to do: the stored series fits exo {mismatch.written_for} only; run that "
        f"exo, or carry the series over: {rebase}; {meanwhile}"
    )


def _git(tree: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(tree), *arguments],
        capture_output=True,
        text=True,
        timeout=GIT_SECONDS,
        check=False,
    )
