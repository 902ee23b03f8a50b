"""exo's multiprocessing channel: a sender and a receiver around one `MpState`, a
`multiprocessing` queue both ends of which every holder has (exo.utils.channels)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.queues import Queue
from typing import Generic, TypeVar

T = TypeVar("T")


class MpState(Generic[T]):
    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.buffer: Queue[T] = context.Queue()


@dataclass(eq=False)
class MpSender(Generic[T]):
    _state: MpState[T]

    def send(self, item: T) -> None:
        self._state.buffer.put(item)

    def close(self) -> None:
        self._state.buffer.close()

    def join(self) -> None:
        """What exo's bootstrap does last: wait until what was sent is in the pipe."""
        self._state.buffer.join_thread()


@dataclass(eq=False)
class MpReceiver(Generic[T]):
    _state: MpState[T]

    def receive(self) -> T:
        return self._state.buffer.get()

    def __iter__(self) -> Iterator[T]:
        while True:
            yield self.receive()
