"""The bugfix series' reach: at which exo commits a stored one applies and passes ruff.

    python -m bench.reach_bugfix --exo-src DIR [--step 25] [--from v1.0.61] [--to main]
        [--results bench/results/reach-bugfix.jsonl]

The same commits as `make reach` (`bench.reach_commits.select`: exo's first-parent
line from `--from` to `--to` every `--step`th commit, and every release between). For
each: `git archive` into a temporary directory; the stored bugfix series
(`patches/bugfix/<version>/`, main's first) that `git apply --check` accepts, as
`patch export --bugfix` picks it; where one does, `git apply`, and exo's two ruff checks
(`ruff check`, `ruff format`: the ruff the tree's own `uv.lock` pins and its config) on
the files it changes, before and after: it passes when it adds no finding. One JSON
line per commit to the results file; then the table, beside it as `.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Final

from exo_orphan_guard.exo import bugfix

from .reach_commits import Commit, git_output, select
from .reach_ruff import pinned_ruff, ruff_findings

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "reach-bugfix.jsonl"


def measure(exo_src: Path, commit: Commit) -> dict[str, Any]:
    tree = Path(tempfile.mkdtemp(prefix="eog-reach-bugfix-"))
    try:
        archive = subprocess.run(
            ["git", "-C", str(exo_src), "archive", commit.sha], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        line: dict[str, Any] = {
            "sha": commit.sha,
            "date": commit.date,
            "release": commit.release,
            "index": commit.index,
            "series": bugfix.fitting(tree),
            "ruff": pinned_ruff(tree),
            "new_findings": None,
        }
        version = line["series"]
        if version is None or line["ruff"] is None:
            return line
        patches = [str(patch) for patch in bugfix.patches(version)]
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
        numstat = subprocess.run(
            ["git", "apply", "--numstat", *patches],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        files = [row.split("\t")[2] for row in numstat.splitlines() if row.endswith(".py")]
        before = set(ruff_findings(line["ruff"], tree, files).findings)
        subprocess.run(["git", "apply", *patches], cwd=tree, env=env, check=True)
        after = ruff_findings(line["ruff"], tree, files).findings
        line["new_findings"] = [finding for finding in after if finding not in before]
        return line
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def passes(line: dict[str, Any]) -> bool:
    return line["series"] is not None and line["new_findings"] == []


def render(lines: list[dict[str, Any]], exo_src: Path, start: str, end: str) -> str:
    releases = [line for line in lines if line["release"] is not None]
    on_line = [line for line in lines if line["index"] is not None]
    head = git_output(exo_src, "rev-parse", end).strip()
    at_end = [line for line in lines if line["sha"] == head]
    rows = [
        ("releases " + f"{start}..", releases),
        (f"{end} ({head[:8]})", at_end),
        (f"first-parent commits {start}..{end} measured", on_line),
    ]
    out = [
        "| exo | measured | a bugfix series applies | applies and adds no ruff finding |",
        "|---|---|---|---|",
    ]
    for label, group in rows:
        applied = sum(line["series"] is not None for line in group)
        clean = sum(passes(line) for line in group)
        out.append(f"| {label} | {len(group)} | {applied} | {clean} |")
    out += [
        "",
        "| release | series that applies | ruff (pinned) | new findings |",
        "|---|---|---|---|",
    ]
    for line in sorted(releases, key=lambda item: item["date"]):
        findings = line["new_findings"]
        shown = "—" if findings is None else (str(len(findings)) if findings else "none")
        series = line["series"] or "none"
        out.append(f"| {line['release']} | {series} | {line['ruff']} | {shown} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reach_bugfix")
    parser.add_argument("--exo-src", type=Path, required=True)
    parser.add_argument("--step", type=int, default=25)
    parser.add_argument("--from", dest="start", default="v1.0.61")
    parser.add_argument("--to", dest="end", default="main")
    parser.add_argument("--results", type=Path, default=RESULTS)
    arguments = parser.parse_args()
    commits = select(arguments.exo_src, arguments.start, arguments.end, arguments.step)
    lines: list[dict[str, Any]] = []
    arguments.results.parent.mkdir(parents=True, exist_ok=True)
    with arguments.results.open("w") as results:
        for commit in commits:
            line = measure(arguments.exo_src, commit)
            lines.append(line)
            results.write(json.dumps(line) + "\n")
            results.flush()
            print(
                f"{commit.sha[:8]} {commit.release or ''} series={line['series']} "
                f"new ruff findings={line['new_findings']}",
                flush=True,
            )
    table = render(lines, arguments.exo_src, arguments.start, arguments.end)
    arguments.results.with_suffix(".md").write_text(
        f"`python -m bench.reach_bugfix --exo-src EXO_SRC --step {arguments.step} "
        f"--from {arguments.start} --to {arguments.end}`\n\n{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()
