"""Executors: how a batch of proposed trials is run.

The driver hands an executor the run's :class:`~lpq.tuning.runner.TrialRunner` once
(``start``) and then batches of :class:`~lpq.tuning.runner.TrialSpec`; the executor
yields a :class:`TrialOutcome` per trial as each finishes, in any order. Executors never
touch the history: the driver alone records outcomes, under their proposal-time ids.

Built in: ``serial`` (this process), ``process`` (a local pool of forked worker
processes) and ``ray`` (:mod:`lpq.tuning.ray_executor`). Plugins add their own through
``lpq_register_executors``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .gate import Gate, Pinned, machine_cores, share_of
from .records import TrialRecord
from .runner import CoreGate, NoGate, TrialRunner, TrialSpec

logger = logging.getLogger("lpq")

#: How often a trial whose worker died is run again before it is recorded as failed.
RETRIES_AFTER_WORKER_DEATH = 1


@dataclass
class TrialOutcome:
    """A finished trial. ``model`` is the quantized model when it lives in this process
    (serial execution), else ``None`` (the driver re-quantizes the one it returns)."""

    spec: TrialSpec
    record: TrialRecord
    model: Any = None


class Executor(ABC):
    """Runs trials for one tuning run. Subclass it to add an executor (a plugin registers
    the class through ``lpq_register_executors``)."""

    name = ""

    def __init__(self, workers: int = 1, **options: Any) -> None:
        self.workers = workers
        self.options = options

    def start(self, runner: TrialRunner) -> None:
        """Receive the run's job; called once, before the first batch (after the fp32
        baseline was measured in the driver, on an idle machine) and before the driver's
        warm-up: start workers on the first :meth:`run`, so they get the warm run cache."""
        self.runner = runner

    @abstractmethod
    def run(self, specs: list[TrialSpec]) -> Iterator[TrialOutcome]:
        """Run every spec; yield each outcome as it finishes (any order)."""

    def close(self) -> None:  # noqa: B027  (optional: most executors hold nothing)
        """Release workers; called once at the end of the run (also on errors)."""

    def abort(self) -> None:
        """Stop the trials running now, at once (the tuning time limit ran out); the run
        then ends. The default waits for them (:meth:`close`): an executor whose workers
        can be stopped (processes, Ray tasks) overrides this."""
        self.close()


def died(spec: TrialSpec, attempts: int, why: str) -> TrialRecord:
    """The record of a trial whose worker died on every attempt."""
    return TrialRecord(
        index=spec.index,
        fingerprint=spec.config().fingerprint(),
        tune_cfg=spec.tune_cfg,
        stage=spec.stage,
        status="error",
        error=f"the worker running this trial died ({why}), {attempts} times",
        attempts=attempts,
    )


class SerialExecutor(Executor):
    """One trial after another in this process (the default)."""

    name = "serial"

    def run(self, specs: list[TrialSpec]) -> Iterator[TrialOutcome]:
        for spec in specs:
            record, model = self.runner.run(spec)
            yield TrialOutcome(spec, record, model)


# ------------------------------------------------------------------------ process pool

_worker_runner: TrialRunner | None = None
_worker_gate: CoreGate = NoGate()


def _init_worker(
    runner: TrialRunner, gate: Gate, slots: Any, workers: int, cores: list[int] | None
) -> None:
    global _worker_runner, _worker_gate
    _worker_runner, _worker_gate = runner, gate
    if cores is not None:  # claim the next share of the cores
        with slots.get_lock():
            slot = slots.value
            slots.value += 1
        _worker_gate = Pinned(gate, share_of(slot, workers, cores), cores)


def _run_in_worker(spec: TrialSpec) -> TrialRecord:
    assert _worker_runner is not None
    record, _model = _worker_runner.run(spec, _worker_gate)
    record.worker = f"pid {os.getpid()}"
    return record


class ProcessPoolTrialExecutor(Executor):
    """A pool of forked worker processes on this machine.

    Workers are forked from the driver after the first trial, so they inherit the fp32
    model, the data and whatever the adaptor already computed (calibration statistics,
    prepared graphs) without pickling any of it; user callables such as an ``eval_func``
    lambda work too. Latency stays fair through a :class:`~lpq.tuning.gate.Gate`: a
    worker measures latency only while no other trial runs. With ``pin=True`` (the
    default) each worker runs on its own share of the cores, and on all of them while it
    measures latency (:class:`~lpq.tuning.gate.Pinned`). A worker that dies (OOM,
    segfault, SIGKILL) breaks the pool; its trials are retried once in a fresh pool, then
    recorded as failed.
    """

    name = "process"

    def __init__(self, workers: int = 2, pin: bool = True, **options: Any) -> None:
        super().__init__(workers, **options)
        self.pin = pin
        if "fork" not in multiprocessing.get_all_start_methods():
            raise ConfigError(
                "the process executor needs the 'fork' start method (Linux, macOS)",
                hint="use --workers 1, or the ray executor",
            )
        self._context = multiprocessing.get_context("fork")
        self._pool: ProcessPoolExecutor | None = None
        self._gate: Gate | None = None

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._gate = Gate.for_processes(self._context)
            slots = self._context.Value("i", 0)
            cores = machine_cores() if self.pin else None
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=self._context,
                initializer=_init_worker,
                initargs=(self.runner, self._gate, slots, self.workers, cores),
            )
        return self._pool

    def _restart(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def run(self, specs: list[TrialSpec]) -> Iterator[TrialOutcome]:
        attempts = dict.fromkeys((s.index for s in specs), 0)
        pending = list(specs)
        isolated = False
        while pending:
            # After a worker died, every trial then in flight failed with it; which one
            # killed it is unknown, so they are retried one at a time: the culprit dies
            # alone and the others finish.
            wave, pending = (pending[:1], pending[1:]) if isolated else (pending, [])
            pool = self._ensure_pool()
            futures: dict[Future[TrialRecord], TrialSpec] = {}
            for spec in wave:
                attempts[spec.index] += 1
                futures[pool.submit(_run_in_worker, spec)] = spec
            broken = False
            while futures:
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in done:
                    spec = futures.pop(future)
                    try:
                        record = future.result()
                    except BrokenProcessPool as exc:
                        broken = True
                        if attempts[spec.index] > RETRIES_AFTER_WORKER_DEATH:
                            yield TrialOutcome(spec, died(spec, attempts[spec.index], str(exc)))
                        else:
                            logger.warning("trial %d: its worker died; retrying it", spec.index)
                            pending.append(spec)
                        continue
                    record.attempts = attempts[spec.index]
                    yield TrialOutcome(spec, record)
            if broken:
                self._restart()
                isolated = True
                pending.sort(key=lambda spec: spec.index)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def abort(self) -> None:
        """Kill the workers (their trials are not recorded) instead of waiting for them.

        ``ProcessPoolExecutor`` has no public way to stop running work before Python 3.14
        (``terminate_workers``), so its worker processes are terminated directly."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        terminate = getattr(pool, "terminate_workers", None)
        if terminate is not None:
            terminate()
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def create_executor(name: str, workers: int, options: dict[str, Any]) -> Executor:
    """The executor for a run: ``auto`` is serial for one worker, else a process pool."""
    from ..plugins.manager import get_plugin_manager

    if name == "auto":
        name = "serial" if workers == 1 else "process"
    executor: Executor = get_plugin_manager().create_executor(name, workers=workers, **options)
    return executor
