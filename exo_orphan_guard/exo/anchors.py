"""Where exo's hooks can sit: the anchors that have not moved since exo v1.0.61.

The stored series leans on import blocks and on runner code that churns, so it fits
two exact trees. These places have stayed as they are in every release from
v1.0.61 to v1.0.71, on main (b5375f8) and in the forks looked at (docs/exo-evidence.md,
"Reach: which of exo's trees `patch apply` reaches"):

- `entrypoint(bound_instance, event_sender, task_receiver, [cancel_receiver,]
  _logger)` in `src/exo/worker/runner/bootstrap.py`, with `logger = _logger` then a
  `try` that turns a runner's failures into exo's error path: the runner's first
  frame, its own task stream in hand (cancel_receiver from v1.0.68 on);
- `Worker.plan_step` in `src/exo/worker/main.py`, whose first statement is
  `while True:`: the worker's plan loop, inside `Worker.run`'s task group and its
  `try`, so what runs before the loop runs inside exo's error handling;
- `src/exo/shared/constants.py`, with `import os` at its top: where exo reads its
  toggles from the environment;
- `Shutdown` in `src/exo/shared/types/tasks.py`, a task with `instance_id` (from
  its base) and `runner_id`: what a live worker sends to end a runner.

And one that is newer: `Runner.main` in `src/exo/worker/runner/runner.py` whose first
statement is `self._start_task_reader()`, the thread that feeds the runner's own
in-process task queue, `self._work_queue` (exo #1993, from v1.0.71-5; in
`runner/runner.py` from v1.0.71-7). Where it is, the parent watch hands the runner
its Shutdown on that queue; elsewhere it goes on a task stream of the runner's own
(`task_relay`), from the top of `entrypoint`'s `try`.

They are found with the standard library's `ast`, so a reformatted or reordered file
still has them, and one that lost them says exactly what it lost. Everything but
`find` is pure: it takes the source text (None: no such file).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from .anchor_facts import Anchor, AnchorName, Found, Missing, MissingReason

ENTRYPOINT_FILE: Final = "src/exo/worker/runner/bootstrap.py"
WORKER_FILE: Final = "src/exo/worker/main.py"
TASKS_FILE: Final = "src/exo/shared/types/tasks.py"
CONSTANTS_FILE: Final = "src/exo/shared/constants.py"
RUNNER_FILE: Final = "src/exo/worker/runner/runner.py"

ENTRYPOINT_PARAMETERS: Final = ("bound_instance", "event_sender", "task_receiver", "_logger")
OPTIONAL_PARAMETER: Final = ("cancel_receiver", 3)
"""From exo v1.0.68 on, before `_logger`."""
WORKER_FIRST_STATEMENT: Final = "while True:"
RUNNER_FIRST_STATEMENT: Final = "self._start_task_reader()"
LOGGER_STATEMENT: Final = "logger = _logger"
HOOK_STATEMENTS: Final = (
    "from exo.worker.runner.leftover_runners import end_leftover_runners",
    "await end_leftover_runners()",
    "from exo.worker.orphan_guard import guard_worker",
    "await guard_worker()",
    "from exo.worker.runner.parent_watch import watch_parent",
    "watch_parent(self.bound_instance, self._work_queue.put)",
    "from exo.worker.runner.task_relay import relay_tasks",
    "task_receiver = relay_tasks(bound_instance, task_receiver)",
)
"""What the series put before an anchor's first statement: skipped, so a hooked tree
keeps its anchor."""
SHUTDOWN_FIELDS: Final = ("instance_id", "runner_id")


FILES: Final[dict[AnchorName, str]] = {
    "entrypoint": ENTRYPOINT_FILE,
    "Worker.plan_step": WORKER_FILE,
    "constants": CONSTANTS_FILE,
    "Shutdown": TASKS_FILE,
    "Runner.main": RUNNER_FILE,
}
REQUIRED: Final[tuple[AnchorName, ...]] = (
    "entrypoint",
    "Worker.plan_step",
    "constants",
    "Shutdown",
)
"""What every tree needs; `Runner.main` only decides where the runner's hook goes."""


def find(tree: Path) -> tuple[Anchor, ...]:
    """Every anchor in the exo tree at `tree`, in the order of `FILES`."""
    texts: dict[AnchorName, str | Missing | None] = {}
    for name, relative in FILES.items():
        try:
            texts[name] = (tree / relative).read_text(encoding="utf-8")
        except FileNotFoundError:
            texts[name] = None
        except (OSError, UnicodeDecodeError) as error:
            texts[name] = Missing(name, relative, "file unreadable", str(error))
    return tuple(
        text if isinstance(text, Missing) else LOCATORS[name](text) for name, text in texts.items()
    )


def all_found(anchors: Sequence[Anchor]) -> bool:
    """Every anchor a tree needs (`REQUIRED`) is there."""
    return all(anchor.found for anchor in anchors if anchor.anchor in REQUIRED)


def entrypoint(source: str | None) -> Anchor:
    """`def entrypoint(...)` at the top level of bootstrap.py, its parameters exo's."""
    module = _parse("entrypoint", ENTRYPOINT_FILE, source)
    if isinstance(module, Missing):
        return module
    definition = _top_level(module.body, "entrypoint")
    if definition is None:
        return _missing("entrypoint", "definition missing", "no top-level `def entrypoint`")
    if isinstance(definition, ast.AsyncFunctionDef):
        return _missing("entrypoint", "signature differs", "`entrypoint` is `async def`")
    if isinstance(definition, ast.ClassDef):
        return _missing("entrypoint", "definition missing", "`entrypoint` is a class")
    arguments = definition.args
    names = [argument.arg for argument in (*arguments.posonlyargs, *arguments.args)]
    defaulted = frozenset(names[len(names) - len(arguments.defaults) :])
    keywords = [
        (argument.arg, default is not None)
        for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    ]
    difference = parameter_difference(names, defaulted)
    required = [name for name, has_default in keywords if not has_default]
    if difference is None and required:
        difference = f"keyword-only parameter `{required[0]}` without a default"
    if difference is None and (arguments.vararg or arguments.kwarg):
        difference = "`*args` or `**kwargs`, which exo's entrypoint does not have"
    if difference is not None:
        return _missing("entrypoint", "signature differs", difference)
    # exo calls entrypoint with its parameters alone: one with a default after them
    # (exo had `pipe_fifo_paths=None` for four commits in 2026-02) changes nothing here.
    extra = [*names[len(_expected(names)) :], *(name for name, _ in keywords)]
    also = f"; with defaults: {', '.join(extra)}" if extra else ""
    shown = ", ".join(names[: len(_expected(names))])
    guarded = try_after_logger(definition.body)
    if guarded is None:
        return _missing(
            "entrypoint",
            "first statement differs",
            f"no `try` after `{LOGGER_STATEMENT}` in `entrypoint`: the runner's hook goes "
            "inside exo's error handling",
        )
    found = _found("entrypoint", source or "", definition, f"entrypoint({shown}){also}")
    first = _first_unhooked(guarded.body) or guarded.body[0]
    line = re.split(r"\r\n|\r|\n", source or "")[first.lineno - 1]
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    return Found("entrypoint", ENTRYPOINT_FILE, found.line, first.lineno, indent, found.detail)


def try_after_logger(body: Sequence[ast.stmt]) -> ast.Try | None:
    """The first `try` after `logger = _logger` in `body`."""
    seen = False
    for node in body:
        if seen and isinstance(node, ast.Try):
            return node
        seen = seen or ast.unparse(node) == LOGGER_STATEMENT
    return None


def _first_unhooked(body: Sequence[ast.stmt]) -> ast.stmt | None:
    hooks = {ast.dump(ast.parse(line).body[0]) for line in HOOK_STATEMENTS}
    return next((node for node in body if ast.dump(node) not in hooks), None)


def parameter_difference(
    names: Sequence[str], defaulted: frozenset[str] = frozenset()
) -> str | None:
    """The first way `names` differ from exo's entrypoint parameters; None: they do
    not (with or without `cancel_receiver`, and with any more after them that have
    defaults, named in `defaulted`)."""
    optional, position = OPTIONAL_PARAMETER
    expected = _expected(names)
    for index, (name, wanted) in enumerate(zip(names, expected, strict=False), start=1):
        if name != wanted:
            also = f" (or `{optional}`)" if index == position + 1 else ""
            return f"parameter {index} is `{name}`, expected `{wanted}`{also}"
    if len(names) < len(expected):
        missing = expected[len(names)]
        return f"parameter {len(names) + 1}, `{missing}`, is missing ({len(names)} given)"
    undefaulted = [name for name in names[len(expected) :] if name not in defaulted]
    if undefaulted:
        number = names.index(undefaulted[0]) + 1
        return f"parameter {number}, `{undefaulted[0]}`, is one too many (and has no default)"
    return None


def _expected(names: Sequence[str]) -> list[str]:
    """exo's parameters, with `cancel_receiver` where `names` has it."""
    optional, position = OPTIONAL_PARAMETER
    expected: list[str] = list(ENTRYPOINT_PARAMETERS)
    if len(names) > position and names[position] == optional:
        expected.insert(position, optional)
    return expected


def worker_plan_step(source: str | None) -> Anchor:
    """`class Worker` with `async def plan_step(self)` whose first statement (after
    the series' own hook, where it is in) is `while True:`."""
    module = _parse("Worker.plan_step", WORKER_FILE, source)
    if isinstance(module, Missing):
        return module
    worker = _top_level(module.body, "Worker")
    if not isinstance(worker, ast.ClassDef):
        return _missing("Worker.plan_step", "definition missing", "no top-level `class Worker`")
    step = _top_level(worker.body, "plan_step")
    if step is None or isinstance(step, ast.ClassDef):
        return _missing(
            "Worker.plan_step", "definition missing", "`class Worker` has no method `plan_step`"
        )
    if not isinstance(step, ast.AsyncFunctionDef):
        return _missing(
            "Worker.plan_step", "signature differs", "`Worker.plan_step` is not `async def`"
        )
    names = [argument.arg for argument in (*step.args.posonlyargs, *step.args.args)]
    if names != ["self"]:
        return _missing(
            "Worker.plan_step",
            "signature differs",
            f"`Worker.plan_step({', '.join(names)})`, expected `self`",
        )
    first = _first_unhooked(step.body)
    if not isinstance(first, ast.While) or ast.unparse(first.test) != "True":
        at = step.body[-1] if first is None else first
        written = ast.get_source_segment(source or "", at) or ast.unparse(at)
        shown = written.splitlines()[0][:80]
        return _missing(
            "Worker.plan_step",
            "first statement differs",
            f"`{shown}` at line {at.lineno}, expected `{WORKER_FIRST_STATEMENT}`",
        )
    return _found(
        "Worker.plan_step", source or "", step, f"first statement `{WORKER_FIRST_STATEMENT}`"
    )


def runner_main(source: str | None) -> Anchor:
    """`class Runner` with `def main(self)` whose first statement (after the series'
    hook, where it is in) is `self._start_task_reader()`, and a `self._work_queue`."""
    module = _parse("Runner.main", RUNNER_FILE, source)
    if isinstance(module, Missing):
        return module
    runner = _top_level(module.body, "Runner")
    if not isinstance(runner, ast.ClassDef):
        return _missing("Runner.main", "definition missing", "no top-level `class Runner`")
    main = _top_level(runner.body, "main")
    if not isinstance(main, ast.FunctionDef):
        return _missing("Runner.main", "definition missing", "`class Runner` has no `def main`")
    queue = any(
        isinstance(node, ast.Attribute) and ast.unparse(node) == "self._work_queue"
        for node in ast.walk(runner)
    )
    first = _first_unhooked(main.body)
    if first is None or ast.unparse(first) != RUNNER_FIRST_STATEMENT or not queue:
        return _missing(
            "Runner.main",
            "first statement differs",
            f"`Runner.main` does not start with `{RUNNER_FIRST_STATEMENT}` feeding "
            "`self._work_queue` (exo before #1993)",
        )
    return _found("Runner.main", source or "", main, f"first statement `{RUNNER_FIRST_STATEMENT}`")


def constants(source: str | None) -> Anchor:
    """exo's `shared/constants.py`, parsed, with `import os` and `EXO_CACHE_HOME` at its
    top level."""
    module = _parse("constants", CONSTANTS_FILE, source)
    if isinstance(module, Missing):
        return module
    imports_os = any(
        isinstance(node, ast.Import)
        and any(alias.name == "os" and alias.asname is None for alias in node.names)
        for node in module.body
    )
    if not imports_os:
        return _missing("constants", "import missing", "no top-level `import os`")
    cache = any(
        isinstance(node, ast.Assign)
        and any(ast.unparse(target) == "EXO_CACHE_HOME" for target in node.targets)
        for node in module.body
    )
    if not cache:
        return _missing("constants", "field missing", "no top-level `EXO_CACHE_HOME`")
    last = module.body[-1].lineno if module.body else 1
    return Found(
        "constants",
        CONSTANTS_FILE,
        1,
        last,
        "",
        "`import os` and `EXO_CACHE_HOME` at the top level",
    )


def shutdown(source: str | None) -> Anchor:
    """`class Shutdown` with `instance_id` and `runner_id`, declared in it or in a base
    class of the same module (exo declares `instance_id` in `BaseTask`)."""
    module = _parse("Shutdown", TASKS_FILE, source)
    if isinstance(module, Missing):
        return module
    classes = {node.name: node for node in module.body if isinstance(node, ast.ClassDef)}
    task = classes.get("Shutdown")
    if task is None:
        return _missing("Shutdown", "definition missing", "no top-level `class Shutdown`")
    declared = _fields(task, classes, frozenset())
    for field in SHUTDOWN_FIELDS:
        if field not in declared:
            return _missing(
                "Shutdown",
                "field missing",
                f"`Shutdown` has no `{field}` (in itself or a base class of {TASKS_FILE})",
            )
    bases = ", ".join(ast.unparse(base) for base in task.bases)
    origins = ", ".join(f"{field} from {declared[field]}" for field in SHUTDOWN_FIELDS)
    return _found("Shutdown", source or "", task, f"Shutdown({bases}): {origins}")


LOCATORS: Final = {
    "entrypoint": entrypoint,
    "Worker.plan_step": worker_plan_step,
    "constants": constants,
    "Shutdown": shutdown,
    "Runner.main": runner_main,
}


def _parse(name: AnchorName, file: str, source: str | None) -> ast.Module | Missing:
    if source is None:
        return Missing(name, file, "file missing", f"no {file}")
    try:
        return ast.parse(source, filename=file)
    except SyntaxError as error:
        return Missing(name, file, "cannot parse", f"line {error.lineno}: {error.msg}")


def _top_level(
    body: Sequence[ast.stmt], name: str
) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None:
    """The last definition of `name` in `body`: the one Python keeps."""
    found: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None = None
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and (
            node.name == name
        ):
            found = node
    return found


def _fields(
    node: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: frozenset[str]
) -> dict[str, str]:
    """Annotated fields: name -> the class that declares it (its own first)."""
    fields: dict[str, str] = {}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
            fields.update(_fields(classes[base.id], classes, seen | {node.name}))
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            fields[statement.target.id] = node.name
    return fields


def _found(
    name: AnchorName,
    source: str,
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
    detail: str,
) -> Found:
    first = node.body[0]
    # ast counts \r\n, \r and \n as line ends, and nothing else (str.splitlines does more)
    line = re.split(r"\r\n|\r|\n", source)[first.lineno - 1]
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    return Found(name, FILES[name], node.lineno, first.lineno, indent, detail)


def _missing(name: AnchorName, reason: MissingReason, detail: str) -> Missing:
    return Missing(name, FILES[name], reason, detail)
