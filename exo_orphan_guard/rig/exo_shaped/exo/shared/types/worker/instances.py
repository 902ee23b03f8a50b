"""exo's `BoundInstance`: a runner's instance and its own id, as the guard reads them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Instance:
    instance_id: str


@dataclass(frozen=True)
class BoundInstance:
    instance: Instance
    bound_runner_id: str
