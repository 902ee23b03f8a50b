"""exo-orphan-guard: exo runners die with their worker; leftover runners get swept.

Everything that runs inside exo is off unless the environment has EXO_ORPHAN_GUARD=1.

The public names load on first use (PEP 562): the command line imports only what its
command needs, so `exo-orphan-guard scan` starts without anyio or loguru.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

from ._version import __version__

# Also what PyInstaller's import analysis follows (it reads these statements, though
# they never run): exo's frozen app bundles every module the names below need.
if TYPE_CHECKING:
    from .exo.worker import prepare_worker
    from .sweeper.engine import KillResult
    from .sweeper.sweep_report import SweepReport
    from .sweeper.sweeping import sweep, sweep_async
    from .sweeper.verdicts import Verdict
    from .watch.clean_ending import ending_cleanly
    from .watch.runner_watch import guard_runner
    from .watch.worker_gone import WorkerGone

_HOMES: Final = {
    "KillResult": "sweeper.engine",
    "SweepReport": "sweeper.sweep_report",
    "Verdict": "sweeper.verdicts",
    "WorkerGone": "watch.worker_gone",
    "ending_cleanly": "watch.clean_ending",
    "guard_runner": "watch.runner_watch",
    "prepare_worker": "exo.worker",
    "sweep": "sweeper.sweeping",
    "sweep_async": "sweeper.sweeping",
}

__all__ = [
    "KillResult",
    "SweepReport",
    "Verdict",
    "WorkerGone",
    "__version__",
    "ending_cleanly",
    "guard_runner",
    "prepare_worker",
    "sweep",
    "sweep_async",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
