"""The core gate: accuracy work side by side, latency measured with the machine alone.

One implementation of :class:`~lpq.tuning.runner.CoreGate` over any condition variable
and two counters, so the process pool (``multiprocessing``) and the Ray executor
(threads inside a gate actor) share the same rules:

* a trial's quantize + accuracy phase holds a *shared* slot;
* a latency measurement waits until no shared slot is held, and while it runs no new
  slot is granted (writer preference, so latency never starves).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class _Box:
    def __init__(self) -> None:
        self.value = 0


class Gate:
    """``cond`` is a (threading or multiprocessing) Condition; ``busy`` and ``exclusive``
    are objects with an int ``value`` shared by every participant."""

    def __init__(self, cond: Any = None, busy: Any = None, exclusive: Any = None) -> None:
        self._cond = cond if cond is not None else threading.Condition()
        self._busy = busy if busy is not None else _Box()
        self._exclusive = exclusive if exclusive is not None else _Box()

    @classmethod
    def for_processes(cls, mp_context: Any) -> Gate:
        return cls(
            mp_context.Condition(),
            mp_context.Value("i", 0, lock=False),
            mp_context.Value("i", 0, lock=False),
        )

    def enter_shared(self) -> None:
        with self._cond:
            while self._exclusive.value:
                self._cond.wait()
            self._busy.value += 1

    def leave_shared(self) -> None:
        with self._cond:
            self._busy.value -= 1
            self._cond.notify_all()

    def enter_exclusive(self) -> None:
        with self._cond:
            while self._exclusive.value:
                self._cond.wait()
            self._exclusive.value = 1
            while self._busy.value:
                self._cond.wait()

    def leave_exclusive(self) -> None:
        with self._cond:
            self._exclusive.value = 0
            self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        self.enter_shared()
        try:
            yield
        finally:
            self.leave_shared()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        self.enter_exclusive()
        try:
            yield
        finally:
            self.leave_exclusive()
