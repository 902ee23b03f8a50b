"""exo-orphan-guard: exo runners die with their worker; leftover runners get swept.

Everything that runs inside exo is off unless the environment has EXO_ORPHAN_GUARD=1.
"""

from .killing import KillResult
from .runner_watch import guard_runner
from .sweeping import SweepReport, sweep, sweep_async
from .verdicts import Verdict
from .worker import (
    FailureDiagnosis,
    diagnose_runner_failure,
    prepare_worker,
    sweep_at_worker_start,
    worker_sweep,
)

__all__ = [
    "FailureDiagnosis",
    "KillResult",
    "SweepReport",
    "Verdict",
    "diagnose_runner_failure",
    "guard_runner",
    "prepare_worker",
    "sweep",
    "sweep_async",
    "sweep_at_worker_start",
    "worker_sweep",
]
