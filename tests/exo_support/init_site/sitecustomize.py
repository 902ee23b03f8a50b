"""Notes when exo's runner enters `mx.distributed.init()`, for tests/test_exo_ring_orphan.py.

On PYTHONPATH with `EOG_INIT_NOTES` set: in a multiprocessing child (exo's runner, a
spawn child with `--multiprocessing-fork`), once `mlx.core` is imported its
`mx.distributed.init` is wrapped: each call first appends `{"pid", "at"}` (`at`:
`time.monotonic()`, system-wide on Linux) to `<EOG_INIT_NOTES>/<pid>.jsonl`, sleeps
`PAUSE` seconds, then calls MLX's own `init` with the same arguments. exo looks the
function up at each call (`mx.distributed.init(backend="ring", strict=True)` in
`utils_mlx.py`), so it calls the wrapper. Test-only instrumentation: anywhere else it does nothing.

The pause: MLX's ring `init` (mlx[cpu] on Linux) holds the GIL while it accepts and
connects, so the runner's event feeder thread (multiprocessing's queue, which exo's
`MpSender` uses) cannot send the `RunnerConnecting` exo's runner queued just before.
exo's plan hands the last rank `ConnectToGroup` only once it has seen every other rank
connecting, so rank 1 would never be started (seen at v1.0.71, 2 of 3 runs). Sleeping
lets the feeder send it first; it changes nothing the test measures (the order of
init entries and the orphan's death, the group forming, the node's event loop).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_NOTES = os.environ.get("EOG_INIT_NOTES", "")
_TARGET = "mlx.core"
PAUSE = 0.5


def _note() -> None:
    import json
    import time

    line = json.dumps({"pid": os.getpid(), "at": time.monotonic()})
    with open(os.path.join(_NOTES, f"{os.getpid()}.jsonl"), "a") as file:
        file.write(line + "\n")


def _wrap(core: ModuleType) -> None:
    distributed: Any = core.distributed
    init = distributed.init

    def noted_init(*args: Any, **kwargs: Any) -> Any:
        import time

        _note()  # before MLX's init, which may never return (it holds the GIL)
        time.sleep(PAUSE)  # the GIL let go: the event feeder sends RunnerConnecting
        return init(*args, **kwargs)

    distributed.init = noted_init


class _WrappingLoader(Loader):
    def __init__(self, inner: Loader) -> None:
        self._inner = inner

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _wrap(module)


class _Finder(MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _WrappingLoader(spec.loader)
                return spec
        return None


if _NOTES and "--multiprocessing-fork" in sys.orig_argv:
    sys.meta_path.insert(0, _Finder())
