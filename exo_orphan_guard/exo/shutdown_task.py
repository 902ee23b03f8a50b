"""exo's own Shutdown, handed to a runner whose worker died (`watch.handover`).

A live worker ends a runner with `Shutdown(instance_id, runner_id)` on the runner's
task stream, which the runner's loop takes at its own safe points (idle, and between
decode steps). When the worker is gone the guard posts that same task on the same
stream (both ends of exo's multiprocessing queue are in the runner), so exo's own
code ends the runner, the way it was written to.

exo's types are looked up by name at the runner's start, in the exo process they
run in: every exo since v1.0.61 has them where they are looked for.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Final, cast, final

_TASKS: Final = "exo.shared.types.tasks"
_CHANNELS: Final = "exo.utils.channels"
_STATE: Final = "_state"
"""exo's `MpReceiver` and `MpSender` are dataclasses around one `MpState` (its
queue): a sender made from the receiver's writes into what the receiver reads."""


class NotExoError(Exception):
    """What the runner was given is not exo's (a fork changed it): no hand-over."""


def _attribute(value: object, name: str) -> object:
    return cast(object, getattr(value, name))


@final
class ExoShutdown:
    """The `watch.handover.Handover` of an exo runner."""

    def __init__(self, bound_instance: object, task_receiver: object) -> None:
        try:
            tasks = importlib.import_module(_TASKS)
            channels = importlib.import_module(_CHANNELS)
            shutdown_type: object = tasks.Shutdown
            task: object = tasks.Shutdown(
                instance_id=_attribute(_attribute(bound_instance, "instance"), "instance_id"),
                runner_id=_attribute(bound_instance, "bound_runner_id"),
            )
            sender: object = channels.MpSender(_attribute(task_receiver, _STATE))
        except Exception as error:
            raise NotExoError(f"{type(error).__name__}: {error}") from error
        if not isinstance(shutdown_type, type) or not callable(getattr(sender, "send", None)):
            raise NotExoError("exo's Shutdown or MpSender is not what it was")
        self._type: type = shutdown_type
        self._task = task
        self._task_id: object = getattr(task, "task_id", None)
        self._sender = sender

    @property
    def name(self) -> str:
        return "exo's Shutdown"

    @property
    def task_id(self) -> str:
        return str(self._task_id)

    def post(self) -> None:
        send = _attribute(self._sender, "send")
        if callable(send):
            send(self._task)

    def taken(self) -> bool:
        """Whether a frame of the main thread holds the Shutdown (exo's loop keeps the
        task it handles in a local: `task` or `item`), from the loop's `match` until
        its shutdown is over."""
        main = threading.main_thread().ident
        frame = None if main is None else sys._current_frames().get(main)  # pyright: ignore[reportPrivateUsage]
        while frame is not None:
            for value in frame.f_locals.values():
                if type(value) is self._type and getattr(value, "task_id", None) == self._task_id:
                    return True
            frame = frame.f_back
        return False
