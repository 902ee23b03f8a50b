"""`make reach`: which commits it measures, what it records for a tree (a fake exo made
a git repository in tmp), the cache, the table, and the picture."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import reach, reach_commits, reach_ruff, reach_table
from bench.reach import AnchorResult, Record
from exo_orphan_guard.exo import bugfix, patching, placement
from tests.test_patch_refusal import GIT, another_exo, fitting_tree


def record(
    commit: str,
    *,
    reached: bool = False,
    release: str | None = None,
    index: int | None = 0,
    anchors_found: int = 4,
    apply_line: str = "",
    date: str = "2026-01-08T17:17:48+00:00",
) -> Record:
    names = ("entrypoint", "Worker.plan_step", "constants", "Shutdown")
    return Record(
        schema=reach.SCHEMA,
        fingerprint="f" * 16,
        commit=commit,
        date=date,
        first_parent_index=index,
        release=release,
        describe=release or f"v1.0.70-3-g{commit[:9]}",
        anchors=[
            AnchorResult(anchor=name, found=number < anchors_found, where="x")
            for number, name in enumerate(names)
        ],
        apply_exit=0 if reached else 2,
        apply_line=apply_line,
        hooks=True if reached else None,
        compiles=True if reached else None,
        ruff="0.14.11",
        ruff_clean=True if reached else None,
        ruff_preexisting=False if reached else None,
        ruff_output="",
        runner_hook="work queue" if reached else None,
        revert_exact=True if reached else None,
        reached=reached,
        seconds=0.5,
    )


def test_every_step_th_commit_and_the_last_are_picked() -> None:
    assert reach_commits.pick([f"c{n}" for n in range(25)], 10) == [0, 10, 20, 24]
    assert reach_commits.pick([f"c{n}" for n in range(21)], 10) == [0, 10, 20]
    assert reach_commits.pick(["only"], 10) == [0]
    assert reach_commits.pick([], 3) == []


def exo_repository(tmp_path: Path) -> tuple[Path, list[str]]:
    """A fake exo's history: v1.0.70 (another exo, the anchors real Python), then the
    tree the main series fits (tagged v1.0.71, its files only the series' context)."""
    repository = tmp_path / "exo"
    another_exo(repository, tag="v1.0.70")
    fitting = tmp_path / "fitting"
    fitting_tree(fitting)
    subprocess.run(["cp", "-a", f"{fitting}/.", str(repository)], check=True)
    git = [*GIT, "-C", str(repository)]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "v1.0.71"], check=True)
    subprocess.run([*git, "tag", "v1.0.71"], check=True)
    listed = subprocess.run(
        [*git, "rev-list", "--reverse", "HEAD"], capture_output=True, text=True, check=True
    )
    return repository, listed.stdout.split()


def test_a_tree_is_measured_from_archive_to_revert(tmp_path: Path) -> None:
    repository, (older, newer) = exo_repository(tmp_path)
    commits = reach.select(repository, "v1.0.70", "HEAD", 10)
    assert [(commit.sha, commit.index, commit.release) for commit in commits] == [
        (older, 0, "v1.0.70"),
        (newer, 1, "v1.0.71"),
    ]
    # Another exo: the stored series does not fit, the hooks are placed at its anchors.
    placed = reach.measure(repository, commits[0], tmp_path / "w0", sys.executable, "f" * 16)
    assert placed["apply_exit"] == 0
    files = len(placement.RELAY.files)
    assert placed["apply_line"].startswith(f"series placed at the anchors ({files} files) applied")
    found = [anchor["found"] for anchor in placed["anchors"]]
    assert found == [True, True, True, True, False]  # no runner.py: the relay
    assert placed["runner_hook"] == "relay"
    assert (placed["hooks"], placed["compiles"], placed["revert_exact"]) == (True, True, True)
    assert placed["ruff"] is None and placed["ruff_clean"] is None  # no uv.lock: no pin
    assert placed["reached"] and reach_table.stopped_at(placed) == "reached"
    # The fitting tree takes the series, has the hooks and reverts byte for byte; but its
    # files are only the series' context lines, which do not compile: not reached.
    applied = reach.measure(repository, commits[1], tmp_path / "w1", sys.executable, "f" * 16)
    assert applied["apply_exit"] == 0 and applied["apply_line"].startswith("series main")
    assert (applied["hooks"], applied["compiles"], applied["revert_exact"]) == (True, False, True)
    assert applied["runner_hook"] == "work queue"
    assert not applied["reached"]
    assert reach_table.stopped_at(applied) == "applied, but py_compile failed"
    assert not (tmp_path / "w0").exists() and not (tmp_path / "w1").exists()


def test_a_tree_without_an_anchor_is_refused_and_says_which(tmp_path: Path) -> None:
    repository, (older, _) = exo_repository(tmp_path)
    main = repository / "src/exo/worker/main.py"
    git_in = [*GIT, "-C", str(repository)]
    subprocess.run([*git_in, "checkout", "-q", older], check=True)
    main.write_text(main.read_text().replace("async def plan_step", "async def planning"))
    subprocess.run([*git_in, "commit", "-qam", "no anchor"], check=True)
    commit = reach.heads(repository, ["HEAD"])[0]
    refused = reach.measure(repository, commit, tmp_path / "w", sys.executable, "f" * 16)
    assert refused["apply_exit"] == 2 and not refused["reached"]
    assert refused["apply_line"].startswith(
        "exo-orphan-guard: error: the hooks have no place in the exo tree at <tree>: "
    )
    assert "Worker.plan_step: missing, src/exo/worker/main.py" in refused["apply_line"]
    assert refused["hooks"] is refused["compiles"] is refused["revert_exact"] is None


def test_ruff_findings_are_compared_without_their_line_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork that does not run exo's ruff has findings of its own: lines the hooks
    shift are the same findings; a finding the hooks add is a new one."""
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip(f"no ruff beside {sys.executable}")

    def binary(version: str) -> Path:
        return ruff

    monkeypatch.setattr(reach_ruff, "ruff_binary", binary)
    source = tmp_path / "f.py"
    source.write_text("import os\n\nx = [\n    1,2]\n")
    before = reach_ruff.ruff_findings("any", tmp_path, ["f.py"])
    assert any("F401" in finding for finding in before.findings)
    assert any(finding.startswith("format: ") for finding in before.findings)
    source.write_text("# shifted\nimport os\n\nx = [\n    1,2]\n")
    shifted = reach_ruff.ruff_findings("any", tmp_path, ["f.py"])
    assert set(shifted.findings) <= set(before.findings)
    source.write_text("import os\nimport sys\n\nx = [\n    1,2]\n")
    added = reach_ruff.ruff_findings("any", tmp_path, ["f.py"])
    assert not set(added.findings) <= set(before.findings)


def test_a_run_resumes_from_its_records_and_drops_stale_ones(tmp_path: Path) -> None:
    repository, (older, newer) = exo_repository(tmp_path)
    results = tmp_path / "reach.jsonl"
    stale = {**record(older), "fingerprint": "0" * 16}
    cached = {**record(newer), "fingerprint": reach.fingerprint(), "apply_line": "cached"}
    results.write_text(json.dumps(stale) + "\n" + json.dumps(cached) + "\n")
    records = reach.run(repository, "v1.0.70", "HEAD", 1, results, sys.executable)
    assert [entry["commit"] for entry in records] == [older, newer]
    assert records[1]["apply_line"] == "cached" and records[0]["apply_exit"] == 0
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [line["commit"] for line in lines] == [newer, older]
    assert {line["fingerprint"] for line in lines} == {reach.fingerprint()}


def test_the_cache_keeps_only_this_fingerprints_records(tmp_path: Path) -> None:
    results = tmp_path / "reach.jsonl"
    old = {**record("a" * 40), "fingerprint": "0" * 16}
    lines = [old, record("a" * 40), record("b" * 40), {**record("b" * 40), "reached": True}]
    results.write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    kept = reach.load(results, "f" * 16)
    assert sorted(kept) == ["a" * 40, "b" * 40] and kept["b" * 40]["reached"]
    assert reach.load(tmp_path / "none.jsonl", "f" * 16) == {}


def test_the_fingerprint_follows_the_series_and_the_deciding_code() -> None:
    assert reach.fingerprint() == reach.fingerprint() and len(reach.fingerprint()) == 16


def test_the_fingerprint_follows_what_apply_applies_and_not_the_bugfix_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(patching.PATCHES_DIR, patches)
    monkeypatch.setattr(patching, "PATCHES_DIR", patches)
    monkeypatch.setattr(bugfix, "BUGFIX_DIR", patches / "bugfix")
    before = reach.fingerprint()
    for patch in (patches / "bugfix").rglob("*.patch"):
        patch.write_bytes(patch.read_bytes() + b"\n")
    assert reach.fingerprint() == before
    (stored,) = (patches / "main").glob("0001-*.patch")
    stored.write_bytes(stored.read_bytes() + b"\n")
    assert reach.fingerprint() != before


def test_the_tree_digest_sees_every_byte_and_every_file(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"one")
    before = reach.tree_digest(tmp_path)
    (tmp_path / "a").write_bytes(b"one\n")
    assert reach.tree_digest(tmp_path) != before
    (tmp_path / "a").write_bytes(b"one")
    (tmp_path / "b").write_bytes(b"")
    assert reach.tree_digest(tmp_path) != before


HUNK_LINE = (
    "exo-orphan-guard: error: series v1.0.71 does not fit exo v1.0.70 at <tree>: "
    "src/exo/worker/main.py, hunk 7 (@@ -300,6 +300,9 @@) of 0003-prepare.patch does not "
    "match; nothing changed"
)


def test_the_table_counts_releases_the_line_and_where_trees_stop() -> None:
    records = [
        record("1" * 40, release="v1.0.61", apply_line=HUNK_LINE),
        record("2" * 40, release="v1.0.64", index=None, apply_line=HUNK_LINE),
        record("3" * 40, index=10, anchors_found=2, apply_line="exo-orphan-guard: error: odd"),
        record("4" * 40, release="v1.0.71", index=20, reached=True),
        record("5" * 40, index=30, reached=True),
    ]
    table = reach_table.render(records, 10, "make reach EXO_SRC=x STEP=10", "main")
    assert "| releases v1.0.61 to v1.0.71 | 3 | 1 (33%): v1.0.71 | 3 (100%) |" in table
    assert f"| main ({'5' * 12}) | 1 | 1 (100%): v1.0.70-3-g555555555 | 1 (100%) |" in table
    assert "| first-parent commits: every 10th, the releases on it, main | 4 | 2 (50%)" in table
    assert "| all trees measured | 5 | 2 (40%): v1.0.71, v1.0.70-3-g555555555 | 4 (80%) |" in table
    assert "| v1.0.64 | 2026-01-08 | main.py, patch 0003 hunk 7 | 4 of 4 |" in table
    assert "- main.py, patch 0003 hunk 7: 2\n- odd: 1\n" in table
    assert "- v1.0.70-3-g333333333: Shutdown: x" in table


def test_a_picture_is_drawn_with_the_releases(tmp_path: Path) -> None:
    plot_reach = pytest.importorskip("bench.plot_reach", reason="needs matplotlib (bench extra)")
    records = [
        record("1" * 40, release="v1.0.61"),
        record("2" * 40, reached=True, date="2026-04-23T15:28:40+01:00"),
    ]
    applied, anchored = plot_reach.points(records)
    assert [ok for _, _, ok in applied] == [False, True]
    assert [ok for _, _, ok in anchored] == [True, True]
    image = tmp_path / "reach.png"
    plot_reach.draw(records, image, "test")
    assert image.read_bytes().startswith(b"\x89PNG")
