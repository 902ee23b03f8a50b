"""The rule that says which tests `make test` runs again on the portable backend and on
Python 3.13 (`tests/passes.py`): its exemptions are live, and `-m` selects by it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import passes


def test_the_rule_reads_what_each_test_reaches() -> None:
    assert passes.passes_of("tests.test_parent_watch") == {"backend", "py313"}
    assert passes.passes_of("tests.test_worker_hooks") == {"backend", "py313"}
    assert passes.passes_of("tests.test_placement") == {"py313"}
    assert passes.passes_of("tests.test_verdicts") == {"backend"}
    # Through a helper: the CLI in a subprocess.
    assert "tests.helpers.cli" in passes.imported_modules("tests.test_selftest")
    assert passes.passes_of("tests.test_selftest") == {"backend"}
    assert passes.passes_of("tests.test_explain") == set()
    assert passes.passes_of("tests.test_settings") == set()
    # A fixture that starts stand-in workers brings the backend pass.
    assert passes.passes_of("tests.test_settings", ["start_worker"]) == {"backend"}


@pytest.mark.parametrize(
    ("exemptions", "name"),
    [(passes.SINGLE_BACKEND, "backend"), (passes.SINGLE_INTERPRETER, "py313")],
)
def test_every_exemption_leaves_a_pass_the_rule_gives(
    exemptions: dict[str, str], name: passes.Pass
) -> None:
    for module, reason in exemptions.items():
        assert name in passes.ruled_passes(module), f"{module} is not in that pass anyway"
        assert name not in passes.passes_of(module)
        assert reason


def test_what_runs_on_one_backend_runs_on_one_interpreter() -> None:
    """The reasons that keep a module to one backend (an integration test whose parts
    run again in their own tests, packaging) hold for the interpreter too: an import
    that makes the rule mark it `py313` would run it twice more, in `pytest-common` and
    on 3.13 (test_chaos did, beside the portable pass's timing tests, after it came to
    import `tree_kill`). Only `WATCH_THROUGH_STAND_INS` puts one on 3.13 on purpose."""
    for module in passes.SINGLE_BACKEND:
        if module not in passes.WATCH_THROUGH_STAND_INS:
            assert passes.passes_of(module) == set(), f"{module} belongs in SINGLE_INTERPRETER"


def test_every_watch_test_through_stand_ins_needs_its_entry() -> None:
    for module in passes.WATCH_THROUGH_STAND_INS:
        assert passes.imported_modules(module), f"{module} does not exist"
        assert "py313" not in passes.imported_passes(module), f"{module} needs no entry"
        assert "py313" in passes.passes_of(module)


@pytest.mark.parametrize(
    ("mark", "selected", "left_out"),
    [
        ("backend", "test_parent_watch.py", "test_explain.py"),
        ("py313", "test_patching.py", "test_verdicts.py"),
    ],
)
def test_dash_m_selects_the_marked_tests(mark: str, selected: str, left_out: str) -> None:
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            mark,
            f"tests/{selected}",
            f"tests/{left_out}",
        ],
        cwd=passes.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    tests = [line for line in listed.stdout.splitlines() if "::" in line]
    assert tests and all(line.startswith(f"tests/{selected}::") for line in tests), tests


def test_every_module_the_rule_names_exists() -> None:
    """A module moved or renamed must move in the rule too, or its tests lose a pass."""
    named = [*passes.BACKEND_DEPENDENT, *passes.BACKEND_INDEPENDENT, *passes.RUNS_IN_EXO]
    missing = [name for name in named if passes.module_path(name) is None]
    assert missing == []
