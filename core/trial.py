"""One trial: quantize with a tune_cfg, evaluate, measure the objective.

A trial is an independent unit of work (fp32 model + tune_cfg + data in, measurements
out), so trials could later run in parallel or on other machines; :class:`TrialRecord`
is plain JSON for the history file.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import DataError, LpqError, TuningError
from .evaluation import LatencyMeasurer, Metric, Postprocess
from .manager import PluginManager
from .tune_config import TuneConfig


@dataclass
class TrialRecord:
    """Measurements of one trial (or of the fp32 baseline, index -1)."""

    index: int
    fingerprint: str
    tune_cfg: dict[str, Any] | None
    stage: str = ""
    status: str = "ok"
    accuracy: float = math.nan
    latency_ms: float | None = None
    size_bytes: int | None = None
    footprint_bytes: int | None = None
    duration_s: float = 0.0
    meets_goal: bool = False
    error: str = ""
    traceback: str = ""
    quantized_ops: int = 0
    fallback_ops: int = 0
    resumed: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if math.isnan(self.accuracy):
            data["accuracy"] = None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if known.get("accuracy") is None:
            known["accuracy"] = math.nan
        return cls(**known)

    def config(self) -> TuneConfig | None:
        return TuneConfig.from_json(self.tune_cfg) if self.tune_cfg is not None else None


@dataclass
class Evaluation:
    """How a candidate model is scored: the user's eval function, or a dataloader + metric.

    Latency is measured by the adaptor around the framework's run call only, on the eval
    dataloader (or, with an eval function, on ``latency_dataloader``).
    """

    pm: PluginManager
    framework: str
    eval_func: Callable[[Any], float] | None = None
    dataloader: Iterable[Any] | None = None
    metric: Metric | None = None
    postprocess: Postprocess | None = None
    iteration: int | None = None
    latency_dataloader: Iterable[Any] | None = None
    latency_iterations: int = 10
    measure_footprint: bool = False

    def __call__(self, model: Any) -> tuple[float, float | None, int | None]:
        """Return (accuracy, latency in ms, peak RSS in bytes or None)."""
        reset_peak_rss()
        if self.eval_func is not None:
            try:
                accuracy = float(self.eval_func(model))
            except LpqError:
                raise
            except Exception as exc:
                raise TuningError(
                    f"the eval function raised {type(exc).__name__}: {exc}",
                    hint="fix the eval function; the traceback is in the tuning history",
                ) from exc
            latency = None
            if self.latency_dataloader is not None:
                measurer = LatencyMeasurer()
                self.pm.evaluate(
                    self.framework,
                    model,
                    self.latency_dataloader,
                    [],
                    measurer=measurer,
                    iteration=self.latency_iterations,
                )
                latency = measurer.median_ms
        else:
            assert self.dataloader is not None and self.metric is not None
            measurer = LatencyMeasurer()
            result = self.pm.evaluate(
                self.framework,
                model,
                self.dataloader,
                [self.metric],
                postprocess=self.postprocess,
                measurer=measurer,
                iteration=self.iteration,
            )
            accuracy, latency = result.metrics[self.metric.name], result.latency_ms
        footprint = peak_rss() if self.measure_footprint else None
        return accuracy, latency, footprint


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


def model_size(pm: PluginManager, framework: str, model: Any) -> int | None:
    """Bytes the adaptor writes when saving ``model`` (the modelsize objective)."""
    with tempfile.TemporaryDirectory(prefix="lpq-size-") as tmp:
        try:
            written = Path(pm.save_model(framework, model, Path(tmp) / "model"))
        except LpqError:
            return None
        if written.is_dir():
            return sum(f.stat().st_size for f in written.rglob("*") if f.is_file())
        parent = written.parent
        return sum(f.stat().st_size for f in parent.rglob("*") if f.is_file())


class TrialRunner:
    """Runs trials against one fp32 model with fixed data and evaluation."""

    def __init__(
        self,
        pm: PluginManager,
        framework: str,
        model: Any,
        calib_dataloader: Iterable[Any] | None,
        evaluation: Evaluation,
        *,
        measure_size: bool,
        train_func: Callable[[Any], Any] | None = None,
    ) -> None:
        self.pm = pm
        self.framework = framework
        self.model = model
        self.calib_dataloader = calib_dataloader
        self.evaluation = evaluation
        self.measure_size = measure_size
        self.train_func = train_func

    def baseline(self) -> TrialRecord:
        start = time.perf_counter()
        accuracy, latency, footprint = self.evaluation(self.model)
        if math.isnan(accuracy):
            raise TuningError("the fp32 model's accuracy is NaN", hint="check the eval data")
        return TrialRecord(
            index=-1,
            fingerprint="fp32",
            tune_cfg=None,
            stage="baseline",
            accuracy=accuracy,
            latency_ms=latency,
            footprint_bytes=footprint,
            size_bytes=model_size(self.pm, self.framework, self.model),
            duration_s=time.perf_counter() - start,
        )

    def quantize(self, cfg: TuneConfig) -> Any:
        return self.pm.quantize(
            self.framework, self.model, cfg, self.calib_dataloader, self.train_func
        )

    def run(self, index: int, cfg: TuneConfig, stage: str) -> tuple[TrialRecord, Any]:
        """Quantize and evaluate; errors in the candidate become an ``error`` record.

        Errors in the user's data are re-raised: every trial would hit them again.
        """
        record = TrialRecord(
            index=index,
            fingerprint=cfg.fingerprint(),
            tune_cfg=cfg.to_json(),
            stage=stage,
            quantized_ops=len(cfg.quantized_ops()),
            fallback_ops=len(cfg.fallback_ops()),
        )
        start = time.perf_counter()
        model = None
        try:
            model = self.quantize(cfg)
            record.accuracy, record.latency_ms, record.footprint_bytes = self.evaluation(model)
            if self.measure_size:
                record.size_bytes = model_size(self.pm, self.framework, model)
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
