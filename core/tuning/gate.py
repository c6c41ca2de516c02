"""The core gate: accuracy work side by side, latency measured with the machine alone.

One implementation of :class:`~lpq.tuning.runner.CoreGate` over any condition variable
and two counters, so the process pool (``multiprocessing``) and the Ray executor
(threads inside a gate actor) share the same rules:

* a trial's quantize + accuracy phase holds a *shared* slot;
* a latency measurement waits until no shared slot is held, and while it runs no new
  slot is granted (writer preference, so latency never starves).

One gate per machine: the process pool has one; on Ray each node has its own, so
measurements on different machines do not wait for each other.

:class:`Pinned` adds where a worker runs: its own share of the machine's cores while
trials run side by side (two workers on two cores do not fight over both, and a
framework that sizes its thread pool to every core does not oversubscribe them), and
every core while it measures latency, as the fp32 baseline was measured.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Collection, Iterator
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


def machine_cores() -> list[int]:
    """The cores this process may run on (all of them where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def share_of(slot: int, workers: int, cores: list[int]) -> list[int]:
    """Worker ``slot``'s cores when ``workers`` share ``cores``: disjoint contiguous
    shares while there are enough cores, else one core each, round robin."""
    if workers <= len(cores):
        return cores[slot * len(cores) // workers : (slot + 1) * len(cores) // workers]
    return [cores[slot % len(cores)]]


def pin(cores: Collection[int]) -> bool:
    """Restrict every thread of this process (and the threads they start later) to
    ``cores``; ``False`` where the OS has no affinity call."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        with contextlib.suppress(OSError):  # a thread that just ended
            os.sched_setaffinity(tid, set(cores))
    return True


class Pinned:
    """A worker's view of its machine's gate: accuracy work on ``own`` cores, latency on
    ``every`` core (restored afterwards)."""

    def __init__(self, gate: Any, own: Collection[int], every: Collection[int]) -> None:
        self.gate, self.own, self.every = gate, list(own), list(every)
        pin(self.own)

    def shared(self) -> contextlib.AbstractContextManager[None]:
        result: contextlib.AbstractContextManager[None] = self.gate.shared()
        return result

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self.gate.exclusive():
            pin(self.every)
            try:
                yield
            finally:
                pin(self.own)


class TrialSlot:
    """The shared slot a trial holds while it quantizes and evaluates. An adaptor that
    times something itself while quantizing (latency-aware quantization) trades it for
    the machine with :func:`exclusive_timing`, then gets it back."""

    def __init__(self, gate: Any) -> None:
        self.gate = gate
        self._held: contextlib.AbstractContextManager[None] | None = None
        self._token: contextvars.Token[TrialSlot | None] | None = None

    def __enter__(self) -> TrialSlot:
        self._held = self.gate.shared()
        self._held.__enter__()
        self._token = _current_slot.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._held is not None and self._token is not None
        _current_slot.reset(self._token)
        self._held.__exit__(None, None, None)

    @contextlib.contextmanager
    def traded_for_the_machine(self) -> Iterator[None]:
        assert self._held is not None
        self._held.__exit__(None, None, None)
        try:
            with self.gate.exclusive():
                yield
        finally:
            self._held = self.gate.shared()
            self._held.__enter__()


_current_slot: contextvars.ContextVar[TrialSlot | None] = contextvars.ContextVar(
    "lpq_trial_slot", default=None
)


@contextlib.contextmanager
def exclusive_timing() -> Iterator[None]:
    """Wrap latency measurements an adaptor makes *inside* ``lpq_quantize`` (e.g.
    latency-aware quantization timing int8 against fp32) in this.

    In a tuning run with parallel workers it waits until no other trial is running and
    gives this one every core, exactly as lpq's own latency pass does, so decisions made
    from those timings are fair; elsewhere (serial runs, ``lpq.quantize``) it does
    nothing. Keep the block short: other trials wait for it.
    """
    slot = _current_slot.get()
    if slot is None:
        yield
        return
    with slot.traded_for_the_machine():
        yield
