"""A process's look at itself, before and after one of the series' hooks runs in it
(issue 35: no class or module of exo or its libraries patched, nothing of the process
changed). Runs in a fresh interpreter, and imports nothing of this package, so that
whatever the package would do on import shows too."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import types
from pathlib import Path

import anyio
import loguru
import psutil

LIBRARIES = ("exo", "loguru", "multiprocessing", "anyio", "threading", "signal", "logging")
PACKAGE = "exo_orphan_guard"
EXO_HAS_LOADED = ("multiprocessing", "multiprocessing.connection", "multiprocessing.queues")
"""Besides anyio, loguru, logging, signal and threading, loaded here anyway."""


def load_what_exo_has() -> None:
    """What exo's processes have loaded before a hook runs, so that the hook's imports
    add nothing to hide a patch in; and anyio's lazy imports done."""
    for name in EXO_HAS_LOADED:
        importlib.import_module(name)
    anyio.run(anyio.sleep, 0)
    for name in dir(anyio):  # anyio 4.16 imports its names on first use, and keeps them
        if not name.startswith("_"):
            getattr(anyio, name)


def look() -> dict[str, object]:
    seen: dict[str, object] = {}
    for name, module in list(sys.modules.items()):
        # None marks an import blocked by name, whatever typeshed says.
        if module is None or name.split(".")[0] not in LIBRARIES:  # pyright: ignore[reportUnnecessaryComparison]
            continue
        for attribute, value in list(vars(module).items()):
            if isinstance(value, types.ModuleType):
                continue  # a submodule imported: bookkeeping, not a patch
            seen[f"{name}:{attribute}"] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for key, member in list(vars(value).items()):
                    seen[f"{name}:{attribute}.{key}"] = id(member)
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            seen[f"handler {number}"] = repr(signal.getsignal(number))
    seen["mask"] = sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    seen["pgid, sid"] = [os.getpgrp(), os.getsid(0)]
    seen["environment"] = dict(os.environ)
    seen["loguru sinks"] = sorted(loguru.logger._core.handlers)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownArgumentType, reportUnknownMemberType]
    seen["logging handlers"] = [repr(handler) for handler in logging.getLogger().handlers]
    seen["children"] = sorted(child.pid for child in psutil.Process().children())
    return seen


def changes(before: dict[str, object], after: dict[str, object]) -> dict[str, list[object]]:
    changed = {
        key: [value, after.get(key)] for key, value in before.items() if after.get(key) != value
    }
    # Something new on a module or class that was there before is a patch too.
    modules = {key.partition(":")[0] for key in before if ":" in key}
    changed |= {
        key: [None, value]
        for key, value in after.items()
        if key not in before and key.partition(":")[0] in modules
    }
    return changed


def load_in_tree_module(name: str, file: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def runner_looks(bound_instance: object, task_receiver: object, in_tree: str, out: str) -> None:
    """A spawned runner's main, as exo main's patched `Runner.main` starts: its
    arguments unpickled (exo's types imported), anyio and loguru loaded, its own task
    queue made, then `watch_parent` from the series' module. Writes what changed, the
    threads, and whether the package was imported, to `out`."""
    import queue

    load_what_exo_has()
    work: queue.Queue[object] = queue.Queue()
    del task_receiver  # exo's task-reader thread reads it; the watch never does
    threads = [thread.name for thread in threading.enumerate()]
    before = look()
    module = load_in_tree_module("exo.worker.runner.parent_watch", in_tree)
    module.watch_parent(bound_instance, work.put)
    after = look()
    Path(out).write_text(
        json.dumps(
            {
                "changed": changes(before, after),
                "new threads": [
                    thread.name for thread in threading.enumerate() if thread.name not in threads
                ],
                "package imported": any(name.split(".")[0] == PACKAGE for name in sys.modules),
            }
        )
    )
