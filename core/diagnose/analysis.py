"""Where a quantized model departs from fp32, op by op, and what falling back each op buys.

Framework-free: everything goes through the plugin manager's facade. Each quantizable op's
output is captured in the fp32 and the quantized model (``lpq_inspect_tensor``, keyed by
fp32 op names) and compared; which ops really run quantized is read from the converted
model (``lpq_quantized_ops``) where the adaptor can say. Then the worst quantized ops are
fallen back one at a time (``lpq_quantize`` with that op in fp32) and the model outputs
measured again (``lpq_evaluate``): the ranking says where error appears, the fallback
says which op is worth giving up.

Each model is also scored with the task metric ``lpq quantize``'s fidelity gate uses
(detection F1, CTC string agreement, top-1 agreement, ...: chosen from the fp32 outputs,
or named), so a fallback is judged by what the model's user sees, not only by the
relative error of its first output (a detector's boxes tensor can read 1% error while a
third of its detections are gone).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..config import PostTrainingQuantConfig
from ..eval.data import OutputRecorder, as_dataloader
from ..eval.metric_choice import fidelity_metric, label_free_metric
from ..eval.metrics import Agreement
from ..plan.capability import FrameworkCapability
from ..plan.tune_config import FLOAT_PRECISIONS, OpConfig, OpKey, TensorConfig, TuneConfig
from ..plugins.manager import PluginManager, get_plugin_manager
from ..tuning.sensitivity import marginal_errors

#: Activation values kept per worst op for the report's histograms.
HISTOGRAM_VALUES = 20_000


@dataclass
class FallbackEffect:
    """The model's outputs with one op put back in fp32 (everything else unchanged)."""

    output_error: float
    agreement: float | None
    #: Share of the quantized model's output error this fallback removes (1: all of it).
    gain: float
    #: The task metric (:attr:`Diagnosis.metric`) against fp32 with this op in fp32.
    fidelity: float | None = None


@dataclass
class OpReport:
    """One quantizable op: how far its output is from fp32, and how it is quantized."""

    name: str
    op_type: str
    precision: str
    quantized: bool
    scheme: str
    #: RMS(quantized - fp32) / RMS(fp32) of the op's output (includes upstream error).
    relative_error: float
    #: How much this op raises the largest relative error of the ops before it in graph
    #: order: the error it adds itself. Ops are ranked by it.
    added_error: float
    sqnr_db: float
    #: RMS error in int8 steps of the op's fp32 output range.
    error_steps: float
    max_abs_error: float
    fp32_range: tuple[float, float]
    fallback: FallbackEffect | None = None


@dataclass
class Diagnosis:
    """The whole report; :meth:`to_json` is what ``diagnosis.json`` holds."""

    framework: str
    model: str
    quantized: str
    config_source: str
    samples: int
    #: Output error and top-1 agreement (class-score outputs) of the quantized model.
    output_error: float
    agreement: float | None
    ops: list[OpReport]
    notes: list[str] = field(default_factory=list)
    #: The task metric every model is scored with against fp32 (higher is better), why it
    #: was chosen, and the quantized model's value.
    metric: str | None = None
    metric_reason: str = ""
    fidelity: float | None = None
    #: The task metric of the model the fallbacks are measured against: the quantized
    #: model, or where that is a given file, the model re-quantized with its
    #: configuration (read from it with the adaptor's default schemes; see ``notes``).
    fallback_base_fidelity: float | None = None
    #: fp32 and quantized activation values of the worst ops (for histograms; not JSON).
    values: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def worst(self, count: int) -> list[OpReport]:
        return self.ops[:count]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("values")
        return _finite(data)


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: write them as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values, dtype=np.float64)))) if values.size else 0.0


def _first(value: Any) -> np.ndarray:
    if isinstance(value, list | tuple):
        value = value[0]
    if isinstance(value, dict):
        value = next(iter(value.values()))
    return np.asarray(value)


def _scheme(cfg: OpConfig | None) -> str:
    if cfg is None or not cfg.quantized:
        return "-"

    def tensor(label: str, t: TensorConfig | None) -> str:
        if t is None:
            return ""
        return f"{label} {t.dtype} {t.scheme} {t.granularity} {t.algorithm}"

    parts = [tensor("w", cfg.weight), tensor("a", cfg.activation)]
    return f"{cfg.mode}: " + "; ".join(p for p in parts if p)


def _compare(fp32: list[np.ndarray], quantized: list[np.ndarray]) -> tuple[float, ...]:
    f = np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in fp32])
    q = np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in quantized])
    diff = q - f
    noise, signal = float(np.sum(diff**2)), float(np.sum(f**2))
    step = max(float(max(f.max(), 0.0) - min(f.min(), 0.0)) / 255, 1e-12)
    rms_diff = _rms(diff)
    return (
        rms_diff / max(_rms(f), 1e-12),
        10 * math.log10(signal / noise) if noise > 0 and signal > 0 else math.inf,
        rms_diff / step,
        float(np.abs(diff).max()) if diff.size else 0.0,
        float(f.min()),
        float(f.max()),
    )


class _Outputs:
    """Model outputs over the diagnosis data, compared with the fp32 model's: relative
    error of the first output, top-1 agreement (class scores), and the task metric."""

    def __init__(
        self,
        pm: PluginManager,
        framework: str,
        data: Any,
        batches: int | None,
        model: Any,
        metric: str | None = None,
        metric_options: Mapping[str, Any] | None = None,
    ):
        self.pm, self.framework, self.data, self.batches = pm, framework, data, batches
        #: the fp32 model's outputs, and their names where its adaptor gives them
        self.reference: list[Any] = self.of(model)
        self.names: list[str] | None = pm.output_names(framework, model)
        #: class-score outputs: top-1 agreement is reported beside the task metric
        automatic, _ = label_free_metric(self.reference[0], names=self.names)
        self.class_scores = automatic == "agreement"
        self.metric, self.reason = fidelity_metric(
            self.reference[0], metric, metric_options, names=self.names, named="named"
        )
        self.metric_options = dict(metric_options or {})
        pm.create_metric(self.metric, **self.metric_options)  # a wrong name fails now

    def of(self, model: Any) -> list[Any]:
        recorder = OutputRecorder()
        self.pm.evaluate(self.framework, model, self.data, [recorder], iteration=self.batches)
        return recorder.outputs

    def error(self, model: Any) -> tuple[float, float | None, float]:
        """(relative output error, top-1 agreement or None, the task metric) against the
        reference."""
        got = self.of(model)
        f = np.concatenate([_first(r).astype(np.float64).reshape(-1) for r in self.reference])
        q = np.concatenate([_first(o).astype(np.float64).reshape(-1) for o in got])
        error = _rms(q - f) / max(_rms(f), 1e-12)
        scorer = self.pm.create_metric(self.metric, **self.metric_options)
        for output, reference in zip(got, self.reference):
            scorer.update(output, reference)
        fidelity = float(scorer.result())
        if not self.class_scores:
            return error, None, fidelity
        agreement = Agreement()
        for output, reference in zip(got, self.reference):
            agreement.update(output, reference)
        return error, agreement.result(), fidelity


def _config_from_model(capability: FrameworkCapability, precisions: dict[str, str]) -> TuneConfig:
    """A tune_cfg matching what a converted model runs: the capability's default for the
    ops it runs quantized, fp32 for the others."""
    ops: dict[OpKey, OpConfig] = {}
    for key in capability.opwise:
        precision = precisions.get(key[0], "fp32")
        if precision in FLOAT_PRECISIONS:
            ops[key] = OpConfig.fallback(precision)
        else:
            ops[key] = capability.default_op_config(key)
    return TuneConfig(ops=ops)


def diagnose(
    model: Any,
    data: Any,
    *,
    quantized: Any = None,
    tune_cfg: TuneConfig | None = None,
    calib: Any = None,
    framework: str | None = None,
    config: PostTrainingQuantConfig | None = None,
    worst: int = 5,
    batches: int | None = None,
    config_source: str = "",
    quantized_label: str = "",
    metric: str | None = None,
    metric_options: Mapping[str, Any] | None = None,
) -> Diagnosis:
    """Diagnose the quantization of ``model`` on ``data``.

    :param model: the fp32 model (object or path).
    :param data: the diagnosis data (any dataloader form lpq takes; labels are not needed).
    :param quantized: the quantized model to diagnose (an object from ``lpq_quantize`` /
        ``lpq_load_model``); ``None``: quantize ``model`` with ``tune_cfg`` or, without
        one, with lpq's default configuration (``config`` applies).
    :param tune_cfg: the configuration the quantized model was made with (from a tuning
        history); needed to fall back exactly one op. Without it, it is read from the
        quantized model (``lpq_quantized_ops``), with the adaptor's default scheme per op.
    :param calib: calibration data for re-quantizing (default: ``data``).
    :param worst: how many of the worst quantized ops to fall back one at a time.
    :param batches: batches of ``data`` to run (``None``: all).
    :param config_source: where ``tune_cfg`` came from, and ``quantized_label`` what the
        quantized model is (a path), for the report.
    :param metric: the task metric every model is scored with against fp32 (a registered
        metric, made with ``metric_options``); default: chosen from the fp32 outputs as
        ``lpq quantize``'s fidelity gate chooses it.
    """
    pm = get_plugin_manager()
    framework = framework or pm.detect_framework(model)
    data = as_dataloader(data)
    calib = as_dataloader(calib) if calib is not None else data
    notes: list[str] = []
    if calib is data:
        notes.append("calibrated on the diagnosis data (no separate calibration data given)")
    capability = pm.query_capability(framework, model, calib, {})
    if quantized is not None:
        check_same_model(pm, framework, model, quantized, capability, data)

    if tune_cfg is None and quantized is None:
        made = _quantize_default(model, config, framework, calib)
        quantized, tune_cfg = made.model, made.tune_cfg
        config_source = config_source or "lpq's default configuration (as `lpq quantize`)"
        base = quantized
    elif tune_cfg is None:
        precisions = pm.quantized_ops(framework, quantized)
        if precisions is None:
            tune_cfg = _quantize_default(model, config, framework, calib).tune_cfg
            notes.append(
                "the adaptor cannot say which ops the quantized model runs in int8: falling "
                "back is measured from lpq's default configuration"
            )
        else:
            tune_cfg = _config_from_model(capability, precisions)
        config_source = config_source or (
            "read from the quantized model (each op's scheme: the adaptor's default)"
        )
        base = pm.quantize(framework, model, tune_cfg, calib)
    else:
        config_source = config_source or "given"
        if quantized is None:
            quantized = pm.quantize(framework, model, tune_cfg, calib)
        base = quantized

    outputs = _Outputs(pm, framework, data, batches, model, metric, metric_options)
    output_error, agreement, fidelity = outputs.error(quantized)

    ops = _op_reports(pm, framework, model, quantized, data, capability, tune_cfg, batches)
    values = _worst_values(pm, framework, model, quantized, data, ops[:worst])
    base_error, base_fidelity = output_error, fidelity
    if base is not quantized:
        base_error, _, base_fidelity = outputs.error(base)
        notes.append(
            f"fallback effects are measured against the model re-quantized with that "
            f"configuration (output error {base_error:.4g}, {outputs.metric} "
            f"{base_fidelity:.4f}; the given model: {output_error:.4g}, {fidelity:.4f})"
        )
    for report in [op for op in ops if op.quantized][:worst]:
        key = (report.name, report.op_type)
        fallen = pm.quantize(framework, model, tune_cfg.with_ops({key: OpConfig.fallback()}), calib)
        error, agreed, fallen_fidelity = outputs.error(fallen)
        gain = (base_error - error) / base_error if base_error > 0 else 0.0
        report.fallback = FallbackEffect(error, agreed, gain, fallen_fidelity)

    return Diagnosis(
        framework=framework,
        model=_shown(model),
        quantized=quantized_label or _shown(quantized),
        config_source=config_source,
        samples=sum(len(_first(r)) for r in outputs.reference),
        output_error=output_error,
        agreement=agreement,
        ops=ops,
        notes=notes,
        values=values,
        metric=outputs.metric,
        metric_reason=outputs.reason,
        fidelity=fidelity,
        fallback_base_fidelity=base_fidelity,
    )


#: Weights of an op that differ from fp32 by more than this (relative RMS) were not made
#: from them by quantization: int8 changes weights by about 1%, int4 by about 10%.
FOREIGN_WEIGHT_ERROR = 0.5


def _weight_error(fp32: dict[str, np.ndarray], quantized: dict[str, np.ndarray]) -> float:
    """Relative RMS difference of an op's weights: tensors of the same name (a quantized
    op may keep fewer, e.g. its bias in int32 elsewhere), else the largest of each when
    the names differ; inf when those do not even have the same size."""
    shared = [name for name in fp32 if name in quantized]
    if shared:
        pairs = [
            (np.asarray(fp32[n], np.float64), np.asarray(quantized[n], np.float64)) for n in shared
        ]
    elif fp32 and quantized:
        pairs = [
            (
                np.asarray(max(fp32.values(), key=np.size), np.float64),
                np.asarray(max(quantized.values(), key=np.size), np.float64),
            )
        ]
    else:
        return 0.0
    if any(f.size != q.size for f, q in pairs):
        return math.inf
    fv = np.concatenate([f.reshape(-1) for f, _ in pairs])
    qv = np.concatenate([q.reshape(-1) for _, q in pairs])
    return _rms(qv - fv) / max(_rms(fv), 1e-12)


def check_same_model(
    pm: PluginManager,
    framework: str,
    model: Any,
    quantized: Any,
    capability: FrameworkCapability,
    data: Any,
) -> None:
    """Raise :class:`lpq.ModelError` when ``quantized`` was not made from ``model``.

    Comparing two unrelated models op by op gives nonsense (a shape error, or a "relative
    error" of thousands): first the quantized model must carry the fp32 model's op names
    (``lpq_quantized_ops`` reports by fp32 name), then its dequantized weights must be
    close to the fp32 weights (``lpq_inspect_tensor``), where the adaptor can say.
    """
    from ..errors import LpqError, ModelError

    names = [name for name, _ in capability.opwise]
    hint = (
        "pass the quantized model made from this MODEL (by `lpq quantize MODEL` or `lpq tune "
        "MODEL`), or the fp32 MODEL it was made from"
    )
    precisions = pm.quantized_ops(framework, quantized)
    if precisions is not None and names and not any(name in precisions for name in names):
        theirs = ", ".join(list(precisions)[:4]) or "none"
        raise ModelError(
            f"the quantized model is not derived from {_shown(model)}: none of its ops "
            f"({theirs}) carry an op name of the fp32 model ({', '.join(names[:4])})",
            hint=hint,
        )
    try:
        fp32 = pm.inspect_tensor(framework, model, data, names, "weight", 1).weights
        got = pm.inspect_tensor(framework, quantized, data, names, "weight", 1).weights
    except LpqError:
        raise
    except Exception:
        return
    errors = {n: _weight_error(fp32[n], got[n]) for n in fp32 if n in got and fp32[n]}
    foreign = {n: e for n, e in errors.items() if e > FOREIGN_WEIGHT_ERROR}
    if errors and len(foreign) * 2 > len(errors):
        name, error = max(foreign.items(), key=lambda item: item[1])
        how = (
            "have other shapes"
            if math.isinf(error)
            else f"differ from fp32 by {error:.0%} (relative RMS)"
        )
        raise ModelError(
            f"the quantized model's weights are not those of {_shown(model)}: {len(foreign)} "
            f"of {len(errors)} ops differ beyond what quantization changes (e.g. {name}'s "
            f"weights {how}; int8 changes weights by about 1%)",
            hint=hint,
        )


def _quantize_default(
    model: Any, config: PostTrainingQuantConfig | None, framework: str, calib: Any
) -> Any:
    from ..api import quantize

    return quantize(model, config or PostTrainingQuantConfig(framework=framework), calib)


def _shown(model: Any) -> str:
    return str(model) if isinstance(model, str) else type(model).__qualname__


def _op_reports(
    pm: PluginManager,
    framework: str,
    model: Any,
    quantized: Any,
    data: Any,
    capability: FrameworkCapability,
    tune_cfg: TuneConfig,
    batches: int | None,
) -> list[OpReport]:
    names = [name for name, _ in capability.opwise]
    fp32 = pm.inspect_tensor(framework, model, data, names, "activation", batches)
    int8 = pm.inspect_tensor(framework, quantized, data, names, "activation", batches)
    precisions = pm.quantized_ops(framework, quantized)
    reports = []
    for key in capability.opwise:
        name, op_type = key
        if name not in fp32.activations or name not in int8.activations:
            continue
        cfg = tune_cfg.ops.get(key)
        if precisions is not None:
            precision = precisions.get(name, "fp32")
        else:
            precision = cfg.precision if cfg is not None else "fp32"
        relative, sqnr, steps, max_abs, low, high = _compare(
            fp32.activations[name], int8.activations[name]
        )
        is_quantized = precision not in FLOAT_PRECISIONS
        reports.append(
            OpReport(
                name=name,
                op_type=op_type,
                precision=precision,
                quantized=is_quantized,
                scheme=_scheme(cfg) if is_quantized else "-",
                relative_error=relative,
                added_error=0.0,
                sqnr_db=sqnr,
                error_steps=steps,
                max_abs_error=max_abs,
                fp32_range=(low, high),
            )
        )
    added = marginal_errors({(r.name, r.op_type): r.relative_error for r in reports})
    for report in reports:
        report.added_error = added[(report.name, report.op_type)]
    reports.sort(key=lambda r: r.added_error, reverse=True)
    return reports


def _worst_values(
    pm: PluginManager,
    framework: str,
    model: Any,
    quantized: Any,
    data: Any,
    worst: list[OpReport],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Activation values (first batch, subsampled) of the worst ops, fp32 and quantized."""
    if not worst:
        return {}
    names = [op.name for op in worst]
    fp32 = pm.inspect_tensor(framework, model, data, names, "activation", 1)
    int8 = pm.inspect_tensor(framework, quantized, data, names, "activation", 1)
    rng = np.random.default_rng(0)
    values = {}
    for name in names:
        f = np.asarray(fp32.activations[name][0], np.float32).reshape(-1)
        q = np.asarray(int8.activations[name][0], np.float32).reshape(-1)
        if f.size > HISTOGRAM_VALUES:
            pick = rng.choice(f.size, HISTOGRAM_VALUES, replace=False)
            f, q = f[pick], q[pick]
        values[name] = (f, q)
    return values
