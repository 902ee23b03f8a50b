"""exo-orphan-guard: exo runners die with their worker; leftover runners get swept.

Everything is off unless the environment has EXO_ORPHAN_GUARD=1.
"""

from .runner_watch import guard_runner
from .worker import prepare_worker

__all__ = ["guard_runner", "prepare_worker"]
