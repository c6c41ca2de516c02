"""The Ray executor: trials on a Ray cluster, or on a local Ray started for the run.

Ray is imported only when this executor is created (``pip install ray``). Each worker
is a Ray actor. On the first batch (after the driver's warm-up) the run's job goes into
the object store once: the :class:`~lpq.tuning.runner.TrialRunner` plus what the
warm-up left in the run cache's memory (the adaptor's prepared model, calibration
statistics); each worker seeds its own run cache with it, so no worker prepares or
calibrates again. Per trial only a :class:`~lpq.tuning.runner.TrialSpec` goes out and a
:class:`~lpq.tuning.records.TrialRecord` comes back.

Latency stays fair with **one gate per node** (a :class:`_NodeGate` actor placed on that
node): a latency measurement waits only for trials on its own machine, so measurements
on different machines run at the same time. Each worker runs on its share of its node's
cores and on all of them while it measures (:class:`~lpq.tuning.gate.Pinned`).

``address`` joins a running cluster (``ray://host:10001`` or ``auto``); without it a
local Ray head is started on 127.0.0.1 with ``workers`` CPUs and shut down at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..cache import using_run_cache
from ..errors import ConfigError
from .executors import RETRIES_AFTER_WORKER_DEATH, Executor, TrialOutcome, died
from .gate import Gate, Pinned, machine_cores, share_of
from .records import TrialRecord
from .runner import CoreGate, TrialRunner, TrialSpec

logger = logging.getLogger("lpq")


class _NodeGate(Gate):
    """The gate actor of one node. Remembers who holds what, so the slots of a worker
    that died can be given back (else the node would wait for it forever)."""

    def __init__(self) -> None:
        super().__init__()
        self._held: dict[str, list[str]] = {}

    def enter(self, holder: str, kind: str) -> None:
        getattr(self, f"enter_{kind}")()
        self._held.setdefault(holder, []).append(kind)

    def leave(self, holder: str, kind: str) -> None:
        self._held[holder].remove(kind)
        getattr(self, f"leave_{kind}")()

    def release(self, holder: str) -> None:
        for kind in self._held.pop(holder, []):
            getattr(self, f"leave_{kind}")()


class _RemoteGate:
    """The worker-side view of its node's gate actor, shaped like a :class:`Gate`."""

    def __init__(self, actor: Any, holder: str) -> None:
        self.actor, self.holder = actor, holder

    @contextlib.contextmanager
    def _held(self, kind: str) -> Iterator[None]:
        import ray

        ray.get(self.actor.enter.remote(self.holder, kind))
        try:
            yield
        finally:
            ray.get(self.actor.leave.remote(self.holder, kind))

    def shared(self) -> contextlib.AbstractContextManager[None]:
        return self._held("shared")

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._held("exclusive")


def cache_snapshot(folder: Path | None) -> dict[str, Any]:
    """The picklable values the run cache at ``folder`` holds in this process's memory."""
    with using_run_cache(folder) as cache:
        items = cache.items()
    kept = {}
    for namespace, key, value in items:
        try:
            pickle.dumps(value)
        except Exception:  # sessions, locks, ...: the worker rebuilds those
            continue
        kept[f"{namespace}/{key}"] = value
    return kept


def seed_cache(folder: Path | None, snapshot: dict[str, Any]) -> None:
    """Put ``snapshot`` (from :func:`cache_snapshot`) into this process's run cache."""
    with using_run_cache(folder) as cache:
        for memory_key, value in snapshot.items():
            namespace, key = memory_key.split("/", 1)
            cache.get_or_compute(namespace, key, _Value(value))


class _Value:
    """A compute function that returns a value known already."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


class _TrialWorker:
    """Body of the worker actor: holds the run's job, runs trials."""

    def __init__(self, job: tuple[TrialRunner, dict[str, Any]], holder: str) -> None:
        self.runner, snapshot = job
        self.holder = holder
        seed_cache(self.runner.cache_dir, snapshot)
        self.gate: CoreGate | None = None

    def node(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def attach(self, gate_actor: Any, slot: int, workers: int, pin: bool) -> list[int]:
        """Use this node's gate; with ``pin``, run on share ``slot`` of ``workers`` of
        the node's cores. Returns the cores this worker runs trials on."""
        gate = _RemoteGate(gate_actor, self.holder)
        if not pin:
            self.gate = gate
            return machine_cores()
        cores = machine_cores()
        own = share_of(slot, workers, cores)
        self.gate = Pinned(gate, own, cores)
        return own

    def run(self, spec: TrialSpec) -> TrialRecord:
        assert self.gate is not None, "attach() first"
        record, _model = self.runner.run(spec, self.gate)
        record.worker = f"ray pid {os.getpid()}"
        return record


class RayExecutor(Executor):
    name = "ray"

    def __init__(
        self, workers: int = 2, address: str | None = None, pin: bool = True, **options: Any
    ) -> None:
        super().__init__(workers, **options)
        try:
            import ray
        except ImportError as exc:
            raise ConfigError(
                "the ray executor needs Ray", hint="pip install ray (or use --executor process)"
            ) from exc
        self._ray = ray
        self.pin = pin
        self._started_here = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(
                    address="local",  # a new Ray, never one a stale session file names
                    num_cpus=workers,
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    log_to_driver=False,
                    configure_logging=False,
                )
                self._started_here = True
        self._actors: list[Any] = []
        #: Node id of each worker, the gate actor of each node, each worker's cores.
        self.placement: dict[int, str] = {}
        self.gates: dict[str, Any] = {}
        self.cores: dict[int, list[int]] = {}
        self._holders: dict[int, str] = {}
        self._started = 0

    def _ensure_workers(self) -> None:
        """Ship the job once and start the workers (first batch, after the warm-up)."""
        if self._actors:
            return
        ray = self._ray
        self._job = ray.put((self.runner, cache_snapshot(self.runner.cache_dir)))
        self._worker_class = ray.remote(num_cpus=1, max_restarts=0)(_TrialWorker)
        self._gate_class = ray.remote(num_cpus=0, max_concurrency=4 * self.workers + 4)(_NodeGate)
        self._actors = [self._new_actor(slot) for slot in range(self.workers)]
        self._attach(list(range(self.workers)))

    def _new_actor(self, slot: int) -> Any:
        self._started += 1
        self._holders[slot] = f"worker {self._started}"
        return self._worker_class.remote(self._job, self._holders[slot])

    def _attach(self, slots: list[int]) -> None:
        """Give each worker in ``slots`` its node's gate (created on first use, placed
        on that node) and its share of that node's cores."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        nodes = ray.get([self._actors[slot].node.remote() for slot in slots])
        self.placement.update(zip(slots, nodes))
        per_node = Counter(self.placement.values())
        calls = []
        for slot in slots:
            node = self.placement[slot]
            if node not in self.gates:
                where = NodeAffinitySchedulingStrategy(node, soft=False)
                self.gates[node] = self._gate_class.options(scheduling_strategy=where).remote()
            rank = sorted(s for s, n in self.placement.items() if n == node).index(slot)
            worker = self._actors[slot]
            calls.append(
                (slot, worker.attach.remote(self.gates[node], rank, per_node[node], self.pin))
            )
        for slot, call in calls:
            self.cores[slot] = ray.get(call)

    def _replace(self, slot: int) -> None:
        """A worker died: free what it held in its node's gate, start another."""
        gate = self.gates.get(self.placement.get(slot, ""))
        if gate is not None:
            self._ray.get(gate.release.remote(self._holders[slot]))
        self._actors[slot] = self._new_actor(slot)
        self._attach([slot])

    def run(self, specs: list[TrialSpec]) -> Iterator[TrialOutcome]:
        ray = self._ray
        self._ensure_workers()
        queue = list(specs)
        attempts = dict.fromkeys((s.index for s in specs), 0)
        idle = list(range(len(self._actors)))
        running: dict[Any, tuple[int, TrialSpec]] = {}
        while queue or running:
            while queue and idle:
                slot, spec = idle.pop(), queue.pop(0)
                attempts[spec.index] += 1
                running[self._actors[slot].run.remote(spec)] = (slot, spec)
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                slot, spec = running.pop(ref)
                try:
                    record = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self._replace(slot)
                    why = str(exc).splitlines()[0]
                    if attempts[spec.index] > RETRIES_AFTER_WORKER_DEATH:
                        yield TrialOutcome(spec, died(spec, attempts[spec.index], why))
                    else:
                        logger.warning("trial %d: its Ray worker died; retrying it", spec.index)
                        queue.append(spec)
                else:
                    record.attempts = attempts[spec.index]
                    yield TrialOutcome(spec, record)
                idle.append(slot)

    def close(self) -> None:
        for actor in [*self._actors, *self.gates.values()]:
            self._ray.kill(actor)
        self._actors, self.gates = [], {}
        if self._started_here:
            self._ray.shutdown()
