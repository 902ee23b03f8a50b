"""exo's tasks as a runner's loop receives them: what the guard builds and matches."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


def _task_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Shutdown:
    """exo's `Shutdown(instance_id=..., runner_id=...)`, with its own task id."""

    instance_id: str
    runner_id: str
    task_id: str = field(default_factory=_task_id)


@dataclass(frozen=True)
class Work:
    """Any other task: the runner spends `seconds` on it in Python, as a model load
    between layers, without looking at its task stream."""

    seconds: float
    task_id: str = field(default_factory=_task_id)


Task = Shutdown | Work
