"""For a runner that reads the worker's task stream itself (exo before the runner's
own task queue, #1993): with EXO_ORPHAN_GUARD on, it reads its tasks from a stream of
its own instead, fed by a relay thread from the worker's. The parent watch hands the
runner its Shutdown on that stream, whose locks the runner alone has ever held: the
worker's stream shares its locks with the worker, and a worker killed while holding
one leaves it held for good.

When the worker closes its stream, the relay closes the runner's, and the runner's
loop ends as it would have on the worker's.
"""

import threading

from anyio import ClosedResourceError, EndOfStream

from exo.shared.constants import EXO_ORPHAN_GUARD
from exo.shared.types.tasks import Task
from exo.shared.types.worker.instances import BoundInstance
from exo.utils.channels import MpReceiver, MpSender, mp_channel
from exo.worker.runner.parent_watch import watch_parent


def relay_tasks(
    bound_instance: BoundInstance, task_receiver: MpReceiver[Task]
) -> MpReceiver[Task]:
    if not EXO_ORPHAN_GUARD:
        return task_receiver
    sender, receiver = mp_channel[Task]()
    threading.Thread(
        target=_relay,
        args=(task_receiver, sender),
        name="task-relay",
        daemon=True,
    ).start()
    watch_parent(bound_instance, sender.send)
    return receiver


def _relay(source: MpReceiver[Task], sink: MpSender[Task]) -> None:
    try:
        with source:
            for task in source:
                sink.send(task)
    except (EndOfStream, ClosedResourceError):
        pass
    finally:
        sink.close()
