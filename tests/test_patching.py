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
    for marker, content in (
        (root / patching.SERIES_MARKERS[series.name], b"# the supervisor\n"),
        (root / patching.EXO_MARKER, b"# the runner's entrypoint\n"),
    ):
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_bytes(content)
    return snapshot(root)


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }


@pytest.fixture(params=SERIES_NAMES)
def series(request: pytest.FixtureRequest) -> patching.Series:
    name: str = request.param
    return next(series for series in SERIES if series.name == name)


FOOTPRINTS = {"main": placement.WORK_QUEUE, "v1.0.71": placement.RELAY}


def test_shipped_series_touch_the_hooks_and_share_the_modules(series: patching.Series) -> None:
    """The footprint: the new files, the settings in constants.py, and the files of
    the runner's hook and Worker.plan_step."""
    footprint = FOOTPRINTS[series.name]
    assert set(series.files) == set(footprint.files)
    created = {
        diff.path: b"".join(diff.hunks[0].new_lines)
        for _, diff in series.diffs
        if diff.old_path is None
    }
    assert created == placement.new_files(footprint)  # exactly exo_tree/, as shipped


IN_EXOS_FILES = {"main": (17, 0, 3), "v1.0.71": (18, 0, 3)}
"""(added, removed, files): the settings (a blank line and 10), and each hook: main's
import at the top, its call and a blank line (3 each); v1.0.71's runner hook keeps its
import beside its call, inside `entrypoint` (4), where the runner's logger is set."""


def test_the_footprint_in_exos_own_files_is_small(series: patching.Series) -> None:
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
    assert (added, removed, len(existing)) == IN_EXOS_FILES[series.name]


def test_apply_then_apply_again_then_revert_is_byte_exact(
    tmp_path: Path, series: patching.Series
) -> None:
    original = build_tree(tmp_path, series)
    assert patching.check(tmp_path).state == "not applied"
    status, changed = patching.apply(tmp_path)
    assert changed and status.state == "applied" and status.series.name == series.name
    applied = snapshot(tmp_path)
    assert applied != original and placement.SWEEP_MODULE in applied
    if series.name == "main":
        runner = applied[anchors.RUNNER_FILE]
        assert b"\nfrom exo.worker.runner.parent_watch import watch_parent\n" in runner
        assert b"        watch_parent(self.bound_instance, self._work_queue.put)\n" in runner
    else:
        bootstrap = applied[anchors.ENTRYPOINT_FILE]
        assert b"        from exo.worker.runner.task_relay import relay_tasks\n" in bootstrap
    assert b"        await end_leftover_runners()\n" in applied[anchors.WORKER_FILE]
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
    main.write_bytes(
        main.read_bytes().replace(b"        await end_leftover_runners()", b"        pass")
    )
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
    # check: series, local series, source, uv.lock; apply: the same (no uv.lock here).
    assert out[0].endswith("not applied") and "already applied" in out[8]
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
            typed = subject.removeprefix(prefix)
            assert len(typed) <= 50 and typed.split(": ", 1)[1][0].isupper(), subject
            body = head.split("\n\n", 1)[1]
            assert len(body.split()) > 30, f"{patch}: the message says too little"


def test_the_pr_names_no_package_and_reaches_no_private_name() -> None:
    """The PR is exo's code only: no line names this package, and nothing reaches past
    exo's public names with a type-checker ignore. The local series is where the
    package is named."""
    for name in SERIES_NAMES:
        for patch in (patching.PATCHES_DIR / name).glob("*.patch"):
            # The toggle, EXO_ORPHAN_GUARD, is exo's setting: the package's names are
            # lower case.
            text = patch.read_text()
            for needle in ("exo-orphan-guard", "exo_orphan_guard", "reportPrivateUsage"):
                assert needle not in text, f"{patch}: {needle}"
        local = patching.WITH_PACKAGE_DIR / name
        assert "exo_orphan_guard.exo.hooks" in "".join(
            patch.read_text() for patch in local.glob("*.patch")
        )


@pytest.mark.parametrize("name", SERIES_NAMES)
def test_the_modules_pass_ruff_with_exos_rules(tmp_path: Path, name: str) -> None:
    """The cheap part of tests/test_exo_checks.py: the modules the series create, as
    they end up, under exo's ruff rules (this checkout's ruff, not exo's 0.14.11)."""
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip(f"no ruff beside {sys.executable}")
    footprint = FOOTPRINTS[name]
    modules = [
        *(footprint.root / path for path in footprint.added),
        *(placement.WITH_PACKAGE.root / path for path in placement.WITH_PACKAGE.added),
    ]
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ruff.lint]\nextend-select = ["I", "N", "B", "A", "PIE", "SIM"]\n'
        '[tool.ruff.lint.isort]\nknown-first-party = ["exo"]\n'
    )
    # BLE001: this checkout's newer ruff counts blind-except among the B rules;
    # exo's 0.14 does not.
    for command in (["check", "--extend-ignore", "BLE001"], ["format", "--check"]):
        result = subprocess.run(
            [str(ruff), *command, "--no-cache", "--config", "pyproject.toml", *map(str, modules)],
            cwd=tmp_path,
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


def test_apply_adds_the_local_series_where_the_package_is_in_the_trees_venv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_placement import shaped_tree

    shaped_tree(tmp_path)
    assert cli.main(["patch", "apply", "--exo", str(tmp_path)]) == 0
    assert patching.check(tmp_path).local is None  # the PR alone
    site = tmp_path / ".venv" / "lib" / "python3.13" / "site-packages"
    (site / "exo_orphan_guard-0.1.0.dist-info").mkdir(parents=True)
    assert cli.main(["patch", "apply", "--exo", str(tmp_path)]) == 0
    assert patching.check(tmp_path).local is not None  # installed there: on top
    out = capsys.readouterr().out.splitlines()
    assert "local series: not applied" in out[1]
    assert out[5].startswith("local series placed at the anchors") and out[5].endswith("applied")
    assert cli.main(["patch", "revert", "--exo", str(tmp_path)]) == 0
    assert patching.check(tmp_path).state == "not applied"
