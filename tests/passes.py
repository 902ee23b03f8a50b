"""Which tests run in which pass of `make test`: the rule, read from each test's imports.

`make test` runs the whole suite once on Python 3.11 and the Linux backend, then
again only where a second run can find something the first cannot, and not on every
pairing: a test marked for both passes below runs in both, which covers both
interpreters and both backends, and leaves the first run (`make test-full` runs every
pairing):

- `backend`: the portable backend's pass (`-m backend`, what a Mac runs). A test runs
  there if it reaches code whose path depends on the backend: `system` (its readers
  and waiters), the watch, the sweep's snapshot and kills, `exec`, the public API, the
  stand-in runners of `rig`, the tools that read the system, or the CLI itself.
- `py313`: the Python 3.13 pass (`-m py313`, exo's interpreter). A test runs there if
  it reaches code that runs inside exo: the public API, the watch (the clean ending
  included), the worker hooks, the patches, or the stand-in runners of `rig` (which
  run the watch).

The markers are never written by hand: `tests/conftest.py` gives each test the
markers its module's imports call for (those of the `tests.helpers` it imports
included, and a module named in a string, as in `python -m exo_orphan_guard.demo`),
and those its fixtures call for. So a test of backend-dependent code cannot lose its
second run by accident. A module leaves a pass only through `SINGLE_BACKEND` or
`SINGLE_INTERPRETER` below, each with its reason, and `tests/test_passes.py` fails
on an entry the rule would not mark anyway. `WATCH_THROUGH_STAND_INS` adds the 3.13
pass to tests of the watch that reach it only through stand-in runners.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Final, Literal

ROOT: Final = Path(__file__).resolve().parents[1]

Pass = Literal["backend", "py313"]

_PUBLIC_API: Final = "exo_orphan_guard"
BACKEND_DEPENDENT: Final[tuple[str, ...]] = (
    _PUBLIC_API,
    "exo_orphan_guard.__main__",
    "exo_orphan_guard.demo",
    "exo_orphan_guard.system",
    "exo_orphan_guard.watch",
    "exo_orphan_guard.sweeper.process_table",
    "exo_orphan_guard.sweeper.engine",
    "exo_orphan_guard.sweeper.family",
    "exo_orphan_guard.sweeper.sweeping",
    "exo_orphan_guard.exo.worker",
    "exo_orphan_guard.guardian",
    "exo_orphan_guard.rig",
    "exo_orphan_guard.tools.doctor",
    "exo_orphan_guard.tools.selftest",
    "exo_orphan_guard.tools.stranded_memory",
    "tests.helpers.cli",
)
"""Module prefixes whose code takes another path on the portable backend."""
BACKEND_INDEPENDENT: Final[tuple[str, ...]] = (
    "exo_orphan_guard.system.settings",
    "exo_orphan_guard.system.process_facts",
    "exo_orphan_guard.rig.notes",
)
"""Exceptions to the prefixes above: pure parsing and plain data."""
RUNS_IN_EXO: Final[tuple[str, ...]] = (
    _PUBLIC_API,
    "exo_orphan_guard.watch",
    "exo_orphan_guard.exo.worker",
    "exo_orphan_guard.exo.patching",
    "exo_orphan_guard.exo.patch_format",
    "exo_orphan_guard.exo.patch_command",
    "exo_orphan_guard.rig.ring_ending",
)
"""Module prefixes of code that exo runs in its own processes (on its Python 3.13), and
the stand-ins of exo's runner that a test drives it through. A test that starts
stand-in runners only to have orphans to sweep (`rig.scenarios`) does not test them."""

FIXTURE_PASSES: Final[Mapping[str, frozenset[Pass]]] = {
    # Starts stand-in workers whose runners run the watch.
    "start_worker": frozenset({"backend"}),
    # Plants processes for the real sweep to judge.
    "planted": frozenset({"backend"}),
}

WATCH_THROUGH_STAND_INS: Final[Mapping[str, str]] = {
    "tests.test_terminal": "the runner's own process group and its terminal are the watch's",
    "tests.test_frozen_app": "the watch inside a frozen app, as exo's app bundles it",
    "tests.test_busy_ending": "the watch's busy wait and its heartbeat thread in the runner",
    "tests.test_exec_launcher": "the exec wrapper's watch, around stand-in ranks of mlx.launch",
}
"""Modules that test the watch only through stand-in runners (`rig.scenarios`), which
import no watch module themselves: they run on 3.13 too, and why."""

SINGLE_BACKEND: Final[Mapping[str, str]] = {
    "tests.test_chaos": (
        "the mix of watches, sweeps and kills at random moments: every backend path it "
        "takes is run on both backends by the tests of its parts (test_parent_watch, "
        "test_clean_ending, test_sweep*, test_wrong_kills)"
    ),
    "tests.test_demo": "the demo end to end: its parts run on both backends in their own tests",
    "tests.test_frozen_app": (
        "PyInstaller's bundle of the package: what differs is the bundle, not the backend"
    ),
    "tests.test_exo_uv_install": "packaging (uv lock, sync, the wheel in exo's venv)",
    "tests.test_dist": "packaging (the wheel and sdist, a clean venv)",
    "tests.test_quick_start": (
        "the README's commands in a new account's environment, which the pass's backend "
        "setting does not reach; the parts they run are tested on both backends"
    ),
}
"""Modules the rule marks `backend` that run on the Linux backend only, and why."""
SINGLE_INTERPRETER: Final[Mapping[str, str]] = {
    "tests.test_chaos": (
        "the mix of watches, sweeps and kills at random moments: every part it reaches "
        "inside exo runs on 3.13 in its own tests (test_parent_watch, test_clean_ending, "
        "test_watchdog_loss); its rounds load both cores, and outside the main pass "
        "they ran beside the portable pass's timing tests"
    ),
    "tests.test_exo_uv_install": "packaging: uv and the wheel, not the interpreter",
    "tests.test_dist": "packaging: the wheel carries the patches, test_patching applies them",
    "tests.test_doctor": (
        "the doctor runs from the command line, not inside exo; the patch check it "
        "shows is patching's, which test_patching runs on 3.13"
    ),
}
"""Modules the rule marks `py313` that run on Python 3.11 only, and why."""


def module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_module(name: str) -> bool:
    return module_path(name) is not None


@functools.cache
def imported_modules(name: str) -> frozenset[str]:
    """The project's modules that module `name` imports or names in a string, and those
    of the `tests.helpers` modules it imports, transitively (helpers that import each
    other included)."""
    modules = set(_direct_imports(name))
    helpers = [module for module in modules if module.startswith("tests.helpers")]
    seen = {name}
    while helpers:
        helper = helpers.pop()
        if helper in seen:
            continue
        seen.add(helper)
        found = _direct_imports(helper)
        modules |= found
        helpers += [module for module in found if module.startswith("tests.helpers")]
    return frozenset(modules)


@functools.cache
def _direct_imports(name: str) -> frozenset[str]:
    path = module_path(name)
    if path is None:
        return frozenset()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                # `from package import module` names the module, not the package.
                found.add(f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # `python -m exo_orphan_guard` runs the CLI; `-m exo_orphan_guard.demo` the demo.
            if node.value == _PUBLIC_API:
                found.add("exo_orphan_guard.__main__")
            elif node.value.startswith("exo_orphan_guard.") and _is_module(node.value):
                found.add(node.value)
    return frozenset(module for module in found if _is_module(module))


def _reaches(modules: Collection[str], prefixes: tuple[str, ...]) -> bool:
    def under(module: str, prefix: str) -> bool:
        return module == prefix or (prefix != _PUBLIC_API and module.startswith(prefix + "."))

    return any(
        any(under(module, prefix) for prefix in prefixes)
        and not any(under(module, exempt) for exempt in BACKEND_INDEPENDENT)
        for module in modules
    )


def imported_passes(module: str, fixtures: Collection[str] = ()) -> frozenset[Pass]:
    """The extra passes that what a test of `module` using `fixtures` reaches calls for."""
    modules = imported_modules(module)
    passes: set[Pass] = set()
    if _reaches(modules, BACKEND_DEPENDENT):
        passes.add("backend")
    if _reaches(modules, RUNS_IN_EXO):
        passes.add("py313")
    for fixture in fixtures:
        passes |= FIXTURE_PASSES.get(fixture, frozenset())
    return frozenset(passes)


def ruled_passes(module: str, fixtures: Collection[str] = ()) -> frozenset[Pass]:
    """The extra passes the rule gives a test of `module` using `fixtures`, before the
    exemptions."""
    passes = set(imported_passes(module, fixtures))
    if module in WATCH_THROUGH_STAND_INS:
        passes.add("py313")
    return frozenset(passes)


def passes_of(module: str, fixtures: Collection[str] = ()) -> frozenset[Pass]:
    """The extra passes a test of `module` using `fixtures` runs in."""
    passes = set(ruled_passes(module, fixtures))
    if module in SINGLE_BACKEND:
        passes.discard("backend")
    if module in SINGLE_INTERPRETER:
        passes.discard("py313")
    return frozenset(passes)
