"""The patch machinery, without exo: on throw-away trees rebuilt from the patches'
own pre-image lines (what each hunk expects to find), with filler in between."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exo_orphan_guard.exo import anchors, format_patch, patching, placement
from exo_orphan_guard.exo.patch_format import (
    HunkMismatchError,
    PatchFormatError,
    apply_hunks,
    parse_unified_diff,
)
from exo_orphan_guard.tools import cli

SERIES = patching.load_series()
SERIES_NAMES = [series.name for series in SERIES]


def build_tree(root: Path, series: patching.Series) -> dict[str, bytes]:
    """Files as the series expects them, rebuilt from every hunk's pre-image, plus
    markers. A later patch may expect original lines no earlier one showed: each file
    is followed through the series as slots of original lines (filled in from what
    the hunks expect there) and lines the patches put in."""
    originals: dict[str, dict[int, bytes]] = {}
    current: dict[str, list[int | bytes]] = {}  # a slot number, or a line a patch wrote
    allocated: dict[str, int] = {}
    created: set[str] = set()
    for _, diff in series.diffs:
        if diff.old_path is None:
            created.add(diff.path)
        if diff.path in created:
            continue
        slots = originals.setdefault(diff.path, {})
        lines = current.setdefault(diff.path, [])
        shift = 0
        for hunk in diff.hunks:
            start = hunk.old_start - 1 + shift
            while len(lines) < start + len(hunk.old_lines):
                lines.append(allocated.get(diff.path, 0))
                allocated[diff.path] = allocated.get(diff.path, 0) + 1
            for entry, expected in zip(lines[start:], hunk.old_lines, strict=False):
                if isinstance(entry, int):
                    slots[entry] = expected
            lines[start : start + len(hunk.old_lines)] = list(hunk.new_lines)
            shift += len(hunk.new_lines) - len(hunk.old_lines)
    for path, slots in originals.items():
        count = allocated.get(path, 0)
        text = [slots.get(slot, f"# filler {slot + 1}\n".encode()) for slot in range(count)]
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(b"".join([*text, b"# end\n"]))
    marker = root / patching.SERIES_MARKERS[series.name]
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_bytes(b"# the supervisor\n")
    return snapshot(root)


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }


@pytest.fixture(params=SERIES_NAMES)
def series(request: pytest.FixtureRequest) -> patching.Series:
    name: str = request.param
    return next(series for series in SERIES if series.name == name)


def test_shipped_series_touch_the_hooks_and_share_one_hooks_module(series: patching.Series) -> None:
    """The footprint: the new files, the toggle in constants.py, and the files of
    entrypoint and Worker.plan_step."""
    assert set(series.files) == set(placement.files())
    created = {
        diff.path: b"".join(diff.hunks[0].new_lines)
        for _, diff in series.diffs
        if diff.old_path is None
    }
    assert created == placement.new_files()  # exactly exo_tree/, as shipped


def test_the_footprint_in_exos_own_files_is_eight_added_lines(series: patching.Series) -> None:
    """Two calls with their imports at the top (3 lines each) and the toggle (2): +8 in
    3 of exo's files, against the seven-patch series' +60/-16 in 9."""
    added = removed = 0
    for _, diff in series.diffs:
        if diff.old_path is None:
            continue
        for hunk in diff.hunks:
            change = format_patch.Change(
                diff.path, b"".join(hunk.old_lines), b"".join(hunk.new_lines)
            )
            added, removed = added + change.counts[0], removed + change.counts[1]
    existing = {diff.path for _, diff in series.diffs if diff.old_path is not None}
    assert (added, removed, len(existing)) == (8, 0, 3)


def test_apply_then_apply_again_then_revert_is_byte_exact(
    tmp_path: Path, series: patching.Series
) -> None:
    original = build_tree(tmp_path, series)
    assert patching.check(tmp_path).state == "not applied"
    status, changed = patching.apply(tmp_path)
    assert changed and status.state == "applied" and status.series.name == series.name
    applied = snapshot(tmp_path)
    assert applied != original and "src/exo/worker/orphan_guard.py" in applied
    bootstrap = applied[anchors.ENTRYPOINT_FILE]
    assert b"\nfrom exo.worker.orphan_guard import guard_runner\n" in bootstrap
    assert b"    guard_runner(bound_instance, task_receiver)\n" in bootstrap
    assert b"        await guard_worker()\n" in applied[anchors.WORKER_FILE]
    assert placement.TOGGLE_LINE.encode() in applied[anchors.CONSTANTS_FILE]
    assert "pyproject.toml" not in applied  # no extra: see uv_project
    assert patching.apply(tmp_path) == (status, False)
    assert snapshot(tmp_path) == applied
    status, changed = patching.revert(tmp_path)
    assert changed and status.state == "not applied"
    assert snapshot(tmp_path) == original
    assert patching.revert(tmp_path)[1] is False


def test_a_tree_neither_series_nor_anchors_fit_changes_nothing_and_is_named(
    tmp_path: Path, series: patching.Series
) -> None:
    build_tree(tmp_path, series)
    main = tmp_path / anchors.WORKER_FILE
    main.write_bytes(main.read_bytes().replace(b"async def plan_step", b"async def planning"))
    before = snapshot(tmp_path)
    with pytest.raises(patching.PatchError, match=r"^the hooks have no place ") as raised:
        patching.apply(tmp_path)
    details = raised.value.details
    assert any(line.startswith("anchor Worker.plan_step: missing") for line in details)
    assert snapshot(tmp_path) == before


def test_local_edits_to_patched_lines_block_revert(tmp_path: Path, series: patching.Series) -> None:
    build_tree(tmp_path, series)
    patching.apply(tmp_path)
    main = tmp_path / "src/exo/worker/main.py"
    main.write_bytes(main.read_bytes().replace(b"        await guard_worker()", b"        pass"))
    before = snapshot(tmp_path)
    with pytest.raises(patching.PatchError):
        patching.revert(tmp_path)
    assert snapshot(tmp_path) == before


def test_a_failed_write_puts_back_what_was_written(
    tmp_path: Path, series: patching.Series, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = build_tree(tmp_path, series)
    real_write = patching._write_one  # pyright: ignore[reportPrivateUsage]
    calls: list[Path] = []

    def failing_third_write(target: Path, content: bytes | None) -> None:
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(target))
        real_write(target, content)

    monkeypatch.setattr(patching, "_write_one", failing_third_write)
    with pytest.raises(patching.PatchError, match="No space left"):
        patching.apply(tmp_path)
    assert snapshot(tmp_path) == original


def test_not_an_exo_tree(tmp_path: Path) -> None:
    with pytest.raises(patching.PatchError, match="is not an exo source tree"):
        patching.check(tmp_path)


def test_without_a_supervisor_file_the_anchors_decide(tmp_path: Path) -> None:
    """No stored series by its supervisor file: placement at the anchors, which this
    tree (only the series' context lines, not Python) does not have."""
    build_tree(tmp_path, SERIES[0])
    (tmp_path / patching.SERIES_MARKERS[SERIES[0].name]).unlink()
    with pytest.raises(patching.PatchError, match="the hooks have no place") as raised:
        patching.check(tmp_path)
    assert any(line.startswith("anchor entrypoint: missing") for line in raised.value.details)


def test_cli_exit_codes_and_one_line_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_tree(tmp_path, SERIES[-1])
    assert cli.main(["patch", "check", "--exo", str(tmp_path)]) == 1
    assert cli.main(["patch", "apply", "--exo", str(tmp_path)]) == 0
    assert cli.main(["patch", "apply", "--exo", str(tmp_path)]) == 0
    assert cli.main(["patch", "check", "--exo", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    # check: series, source, uv.lock; apply: series, source, uv.lock (no uv.lock here).
    assert out[0].endswith("not applied") and "already applied" in out[6]
    assert cli.main(["patch", "revert", "--exo", str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "not an exo source tree" in error


# --- the diff format itself -----------------------------------------------------------

DIFF = b"""diff --git a/f.txt b/f.txt
--- a/f.txt
+++ b/f.txt
@@ -2,3 +2,4 @@ header
 two
-three
+THREE
+three and a half
 four
"""


def test_hunks_apply_at_an_offset_and_reverse_exactly() -> None:
    (diff,) = parse_unified_diff(DIFF)
    original = b"zero\none\ntwo\nthree\nfour\nfive\n"
    shifted = b"extra\n" + original
    patched = apply_hunks(shifted, diff.hunks)
    assert patched == b"extra\nzero\none\ntwo\nTHREE\nthree and a half\nfour\nfive\n"
    assert apply_hunks(patched, diff.reversed().hunks) == shifted


def test_a_hunk_is_found_in_a_file_much_shorter_than_its_line_number_says() -> None:
    (diff,) = parse_unified_diff(DIFF.replace(b"@@ -2,3 +2,4 @@", b"@@ -40,3 +40,4 @@"))
    assert apply_hunks(b"one\ntwo\nthree\nfour\n", diff.hunks) == (
        b"one\ntwo\nTHREE\nthree and a half\nfour\n"
    )


def test_a_missing_context_line_is_a_mismatch() -> None:
    (diff,) = parse_unified_diff(DIFF)
    with pytest.raises(HunkMismatchError) as raised:
        apply_hunks(b"two\n3\nfour\n", diff.hunks)
    assert raised.value.index == 1


def test_no_newline_at_end_of_file_is_kept() -> None:
    diff = b"--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n\\ No newline at end of file\n+new\n"
    (parsed,) = parse_unified_diff(diff)
    assert apply_hunks(b"old", parsed.hunks) == b"new\n"


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"not a diff",
        b"--- a/f\n",
        b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n x\n",
        b"--- f\n+++ f\n@@ -1 +1 @@\n-a\n+b\n",
    ],
)
def test_malformed_diffs_are_rejected(garbage: bytes) -> None:
    with pytest.raises(PatchFormatError):
        parse_unified_diff(garbage)


def test_each_shipped_patch_is_a_format_patch_with_a_subject_and_a_message() -> None:
    for name in SERIES_NAMES:
        directory = patching.PATCHES_DIR / name
        patches = patching.patch_files(directory)
        assert [patch.name for patch in patches] == list(patching.PATCH_NAMES)
        assert (directory / patching.COVER_LETTER).is_file()
        for number, patch in enumerate(patches, start=1):
            text = patch.read_text()
            head, _, _ = text.partition("\n---\n")
            lines = head.splitlines()
            assert lines[0].startswith("From ") and lines[1].startswith("From: "), patch
            subject = next(line for line in lines if line.startswith("Subject: "))
            prefix = f"Subject: [PATCH {number}/3] "
            assert subject.startswith(f"{prefix}feature: "), patch  # exo's RULES.md
            assert len(subject.removeprefix(prefix)) <= 50, subject
            body = head.split("\n\n", 1)[1]
            assert len(body.split()) > 30, f"{patch}: the message says too little"


def test_the_cover_letter_says_the_extra_is_not_in_the_series() -> None:
    for name in SERIES_NAMES:
        cover = (patching.PATCHES_DIR / name / patching.COVER_LETTER).read_text()
        assert "uv run --with exo-orphan-guard exo" in cover
        assert 'orphan-guard = ["exo-orphan-guard"]' in cover and "uv lock" in cover
        assert " 5 files changed, 469 insertions(+)\n" in cover
        assert "Hardware test plan" in cover  # exo's PR template asks for one


@pytest.mark.parametrize("name", SERIES_NAMES)
def test_the_hooks_module_passes_ruff_with_exos_rules(tmp_path: Path, name: str) -> None:
    """The cheap part of tests/test_exo_checks.py: the module the series creates, as it
    ends up, under exo's ruff rules (this checkout's ruff, not exo's 0.14.11)."""
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip(f"no ruff beside {sys.executable}")
    series = next(s for s in SERIES if s.name == name)
    build_tree(tmp_path / "exo", series)
    patching.apply(tmp_path / "exo", SERIES)
    module = tmp_path / "exo" / "src" / "exo" / "worker" / "orphan_guard.py"
    (tmp_path / "exo" / "pyproject.toml").write_text(
        '[tool.ruff.lint]\nextend-select = ["I", "N", "B", "A", "PIE", "SIM"]\n'
        '[tool.ruff.lint.isort]\nknown-first-party = ["exo"]\n'
    )
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [str(ruff), *command, "--no-cache", str(module)],
            cwd=tmp_path / "exo",
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_export_writes_the_series_and_its_cover_letter_and_says_why(
    tmp_path: Path, series: patching.Series, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "exo"
    build_tree(tree, series)
    out = tmp_path / "out"
    assert cli.main(["patch", "export", "--exo", str(tree), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    marker = patching.SERIES_MARKERS[series.name]
    assert (
        lines[0] == f"series {series.name}: {tree} has {marker}, which only exo {series.name} has"
    )
    assert lines[1] == f"state in {tree}: not applied (series {series.name})"
    directory = patching.PATCHES_DIR / series.name
    written = sorted(path.name for path in out.iterdir())
    assert written == sorted(path.name for path in directory.glob("*.patch"))
    assert all((out / name).read_bytes() == (directory / name).read_bytes() for name in written)
    assert cli.main(["patch", "apply", "--exo", str(tree), "--out", str(out)]) == 2
    assert "--out is for export" in capsys.readouterr().err
