"""The Ray executor: trials on a Ray cluster, or on a local Ray started for the run.

Ray is imported only when this executor is created (``pip install ray``). Each worker
is a Ray actor that receives the run's :class:`~lpq.tuning.runner.TrialRunner` once
through the object store and keeps it, so the adaptor's per-run state (prepared model,
calibration statistics) is built once per worker, not once per trial. A gate actor
(:class:`~lpq.tuning.gate.Gate` over threads) keeps latency fair: a latency measurement
waits until no trial runs on the workers that share it.

``address`` joins a running cluster (``ray://host:10001`` or ``auto``); without it a
local Ray head is started on 127.0.0.1 with ``workers`` CPUs and shut down at the end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError
from .executors import RETRIES_AFTER_WORKER_DEATH, Executor, TrialOutcome, died
from .gate import Gate
from .records import TrialRecord
from .runner import TrialRunner, TrialSpec

logger = logging.getLogger("lpq")


class _RemoteGate:
    """The worker-side view of the gate actor, shaped like a :class:`Gate`."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def _call(self, method: str) -> None:
        import ray

        ray.get(getattr(self.actor, method).remote())

    def shared(self) -> Any:
        return _Held(self, "enter_shared", "leave_shared")

    def exclusive(self) -> Any:
        return _Held(self, "enter_exclusive", "leave_exclusive")


class _Held:
    def __init__(self, gate: _RemoteGate, enter: str, leave: str) -> None:
        self.gate, self.enter, self.leave = gate, enter, leave

    def __enter__(self) -> None:
        self.gate._call(self.enter)

    def __exit__(self, *exc: object) -> None:
        self.gate._call(self.leave)


class _TrialWorker:
    """Body of the worker actor: holds the run's job, runs trials."""

    def __init__(self, runner: TrialRunner, gate_actor: Any) -> None:
        self.runner = runner
        self.gate = _RemoteGate(gate_actor)

    def run(self, spec: TrialSpec) -> TrialRecord:
        record, _model = self.runner.run(spec, self.gate)
        record.worker = f"ray pid {os.getpid()}"
        return record


class RayExecutor(Executor):
    name = "ray"

    def __init__(self, workers: int = 2, address: str | None = None, **options: Any) -> None:
        super().__init__(workers, **options)
        try:
            import ray
        except ImportError as exc:
            raise ConfigError(
                "the ray executor needs Ray", hint="pip install ray (or use --executor process)"
            ) from exc
        self._ray = ray
        self._started_here = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(
                    num_cpus=workers,
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    log_to_driver=False,
                    configure_logging=False,
                )
                self._started_here = True
        self._actors: list[Any] = []

    def start(self, runner: TrialRunner) -> None:
        super().start(runner)
        ray = self._ray
        self._gate = ray.remote(num_cpus=0, max_concurrency=4 * self.workers + 4)(Gate).remote()
        self._runner_ref = ray.put(runner)
        self._worker_class = ray.remote(num_cpus=1, max_restarts=0)(_TrialWorker)
        self._actors = [self._new_actor() for _ in range(self.workers)]

    def _new_actor(self) -> Any:
        return self._worker_class.remote(self._runner_ref, self._gate)

    def run(self, specs: list[TrialSpec]) -> Iterator[TrialOutcome]:
        ray = self._ray
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
                    self._actors[slot] = self._new_actor()
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
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []
        if self._started_here:
            self._ray.shutdown()
