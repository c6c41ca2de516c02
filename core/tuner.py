"""The accuracy-aware tuning loop and the Python API entry points ``fit`` and ``quantize``.

``fit`` asks the adaptor what it can do, builds the tuning space, evaluates the fp32
baseline, lets a strategy propose configs, and returns the best quantized model that
meets the accuracy goal (or, if none does, the best candidate with ``goal_met=False``).
Every trial is written to the history as it finishes; re-running resumes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .config import PostTrainingQuantConfig
from .data import OutputRecorder, ReferenceLoader, as_dataloader, split_batch
from .errors import ConfigError, NoAdaptorError, TuningError
from .evaluation import Inspection, Metric, Postprocess
from .history import TuningHistory, data_fingerprint, model_fingerprint
from .manager import PluginManager, get_plugin_manager
from .strategy.base import StopTuning, TuningContext
from .trial import Evaluation, TrialRecord, TrialRunner, model_size
from .tune_config import OpKey, TuneConfig
from .tuning_space import TuningSpace, build_tuning_space

logger = logging.getLogger("lpq")

#: Called after every trial with the record (for progress display).
TrialCallback = Callable[[TrialRecord], None]


@dataclass
class QuantizedModel:
    """A quantized model with the tune_cfg that produced it."""

    model: Any
    framework: str
    tune_cfg: TuneConfig

    def save(self, path: str | Path) -> Path:
        """Write the model through its adaptor (atomically, with its tune_cfg)."""
        return get_plugin_manager().save_model(self.framework, self.model, path)


@dataclass
class TuningResult(QuantizedModel):
    """What ``fit`` returns: the chosen model and everything measured on the way."""

    baseline: TrialRecord = field(default_factory=lambda: TrialRecord(-1, "fp32", None))
    best: TrialRecord = field(default_factory=lambda: TrialRecord(-1, "", None))
    trials: list[TrialRecord] = field(default_factory=list)
    goal_met: bool = False
    metric: str = ""
    higher_is_better: bool = True
    objective: str = "performance"
    history_path: Path | None = None
    stop_reason: str = ""

    @property
    def accuracy(self) -> float:
        return self.best.accuracy

    def summary(self) -> dict[str, Any]:
        base, best = self.baseline, self.best
        speedup = base.latency_ms / best.latency_ms if base.latency_ms and best.latency_ms else None
        size_ratio = (
            base.size_bytes / best.size_bytes if base.size_bytes and best.size_bytes else None
        )
        relative_loss = (
            (base.accuracy - best.accuracy) / abs(base.accuracy) if base.accuracy else None
        )
        if relative_loss is not None and not self.higher_is_better:
            relative_loss = -relative_loss
        return {
            "framework": self.framework,
            "metric": self.metric,
            "goal_met": self.goal_met,
            "stop_reason": self.stop_reason,
            "baseline_accuracy": base.accuracy,
            "final_accuracy": best.accuracy,
            "relative_accuracy_loss": relative_loss,
            "baseline_latency_ms": base.latency_ms,
            "final_latency_ms": best.latency_ms,
            "latency_speedup": speedup,
            "baseline_size_bytes": base.size_bytes,
            "final_size_bytes": best.size_bytes,
            "size_reduction": size_ratio,
            "trials": len(self.trials),
            "best_trial": best.index,
            "quantized_ops": best.quantized_ops,
            "fallback_ops": best.fallback_ops,
            "history": str(self.history_path) if self.history_path else None,
        }


class _RunContext(TuningContext):
    """The tuner's implementation of the strategy-facing context."""

    def __init__(
        self,
        *,
        space: TuningSpace,
        runner: TrialRunner,
        history: TuningHistory,
        config: PostTrainingQuantConfig,
        baseline: TrialRecord,
        higher_is_better: bool,
        first_hit: bool,
        inspect_data: Iterable[Any] | None,
        on_trial: TrialCallback | None,
    ) -> None:
        self.space = space
        self.runner = runner
        self.history = history
        self.config = config
        self.baseline = baseline
        self.higher_is_better = higher_is_better
        self.first_hit = first_hit
        self.rng = random.Random(config.tuning_criterion.seed)
        self.inspect_data = inspect_data
        self.on_trial = on_trial
        self.by_fingerprint: dict[str, TrialRecord] = {}
        self.models: dict[str, Any] = {}
        self._best: TrialRecord | None = None
        self.best_any: TrialRecord | None = None
        self.started = time.monotonic()
        self.stop_reason = "search space exhausted"
        self._sensitivity: dict[str, dict[OpKey, float] | None] = {}
        self._fp32_inspection: Inspection | None = None
        #: The latest trial's model, so inspecting the config just tried re-quantizes nothing.
        self._last_model: tuple[str, Any] = ("", None)

    # ------------------------------------------------------------------ trials

    def evaluate(self, cfg: TuneConfig, stage: str = "") -> TrialRecord:
        fingerprint = cfg.fingerprint()
        if fingerprint in self.by_fingerprint:
            return self.by_fingerprint[fingerprint]
        if not cfg.quantized_ops():
            # Every op in fp32 is the baseline itself, not a candidate: never "meets" the
            # goal, costs no trial, and is not written to the history.
            skipped = TrialRecord(
                index=-1,
                fingerprint=fingerprint,
                tune_cfg=cfg.to_json(),
                stage=stage,
                status="skipped",
                error="every op would stay in fp32 (the baseline)",
                fallback_ops=len(cfg.fallback_ops()),
            )
            self.by_fingerprint[fingerprint] = skipped
            return skipped
        criterion = self.config.tuning_criterion
        if len(self.history.trials) >= criterion.max_trials:
            self.stop_reason = f"max trials ({criterion.max_trials}) reached"
            raise StopTuning(self.stop_reason)
        if criterion.timeout and time.monotonic() - self.started > criterion.timeout:
            self.stop_reason = f"timeout ({criterion.timeout:g} s) reached"
            raise StopTuning(self.stop_reason)
        index = len(self.history.trials)
        previous = self.history.previous.get(fingerprint)
        model = None
        if previous is not None:
            record = TrialRecord.from_json(
                {**previous.to_json(), "index": index, "stage": stage, "resumed": True}
            )
        else:
            record, model = self.runner.run(index, cfg, stage)
        record.meets_goal = record.status == "ok" and self.config.accuracy_criterion.meets(
            self.baseline.accuracy, record.accuracy, self.higher_is_better
        )
        self.history.add(record)
        self.by_fingerprint[fingerprint] = record
        self._last_model = (fingerprint, model)
        self._track(record, model)
        if self.on_trial is not None:
            self.on_trial(record)
        if record.meets_goal and self.first_hit:
            self.stop_reason = "accuracy goal met"
            raise StopTuning(self.stop_reason)
        return record

    def _track(self, record: TrialRecord, model: Any) -> None:
        if record.status != "ok":
            return
        if record.meets_goal and self.better(record, self._best):
            self._keep(record, model, self._best)
            self._best = record
        if self.best_any is None or self._more_accurate(record, self.best_any):
            self._keep(record, model, self.best_any)
            self.best_any = record

    def _keep(self, record: TrialRecord, model: Any, replaced: TrialRecord | None) -> None:
        if model is not None:
            self.models[record.fingerprint] = model
        keep = {r.fingerprint for r in (record, self._best, self.best_any) if r is not None}
        if replaced is not None and replaced.fingerprint not in keep:
            self.models.pop(replaced.fingerprint, None)

    def _more_accurate(self, a: TrialRecord, b: TrialRecord) -> bool:
        return a.accuracy > b.accuracy if self.higher_is_better else a.accuracy < b.accuracy

    def meets_goal(self, record: TrialRecord) -> bool:
        return record.meets_goal

    def better(self, a: TrialRecord, b: TrialRecord | None) -> bool:
        if b is None:
            return True
        objective = self.config.tuning_criterion.objective
        value = {
            "performance": lambda r: r.latency_ms,
            "modelsize": lambda r: r.size_bytes,
            "footprint": lambda r: r.footprint_bytes,
        }[objective]
        va, vb = value(a), value(b)
        if va is not None and vb is not None and va != vb:
            return bool(va < vb)
        # No measurement to compare: more quantized ops, then higher accuracy, wins.
        if a.quantized_ops != b.quantized_ops:
            return a.quantized_ops > b.quantized_ops
        return self._more_accurate(a, b)

    @property
    def best(self) -> TrialRecord | None:
        return self._best

    # ------------------------------------------------------------------ sensitivity

    def op_sensitivity(self, cfg: TuneConfig) -> dict[OpKey, float] | None:
        if not cfg.quantized_ops():
            return {}
        fingerprint = cfg.fingerprint()
        if fingerprint in self._sensitivity:
            return self._sensitivity[fingerprint]
        result: dict[OpKey, float] | None = None
        if self.inspect_data is not None:
            try:
                result = self._inspect_errors(cfg)
            except NoAdaptorError:
                result = None
        self._sensitivity[fingerprint] = result
        return result

    def _inspect_errors(self, cfg: TuneConfig) -> dict[OpKey, float]:
        """Marginal activation error of every quantized tunable op of ``cfg``.

        All tunable ops are inspected, fallen-back ones included, because their outputs
        still carry upstream damage that the marginal score must subtract.
        """
        runner, pm = self.runner, self.runner.pm
        assert self.inspect_data is not None
        keys = self.space.tunable_ops
        names = [name for name, _ in keys]
        if self._fp32_inspection is None:
            self._fp32_inspection = pm.inspect_tensor(
                runner.framework, runner.model, self.inspect_data, names, "activation", 2
            )
        fp32 = self._fp32_inspection
        fingerprint = cfg.fingerprint()
        quantized = self.models.get(fingerprint)
        if quantized is None and self._last_model[0] == fingerprint:
            quantized = self._last_model[1]
        if quantized is None:
            quantized = runner.quantize(cfg)
        int8 = pm.inspect_tensor(
            runner.framework, quantized, self.inspect_data, names, "activation", 2
        )
        raw: dict[OpKey, float] = {}
        for key in keys:
            ref, got = fp32.activations.get(key[0]), int8.activations.get(key[0])
            raw[key] = (
                float(np.mean([relative_error(r, g) for r, g in zip(ref, got)]))
                if ref and got
                else 0.0
            )
        logger.debug("per-op relative activation error: %s", raw)
        scores = marginal_errors(raw)
        return {key: score for key, score in scores.items() if cfg.ops[key].quantized}


def relative_error(reference: np.ndarray, quantized: np.ndarray) -> float:
    """Quantization error of one activation, robust to outlier channels.

    A plain MSE relative to the tensor's energy is dominated by its largest channels: an
    outlier channel that forces a coarse scale onto a per-tensor quantizer destroys every
    other channel, yet hardly moves that ratio. So the error is taken relative to each
    slice along an axis (a channel, a feature), averaged over slices; the channel axis is
    not known to lpq, so every non-batch axis is tried and the worst is kept.
    """
    ref = np.asarray(reference, np.float64)
    diff = np.asarray(quantized, np.float64).reshape(ref.shape) - ref
    floor = 1e-5 * float(np.mean(ref**2)) + 1e-12  # dead slices must not dominate
    if ref.ndim < 2:
        return float(np.mean(diff**2)) / (float(np.mean(ref**2)) + 1e-12)
    worst = 0.0
    for axis in range(1, ref.ndim):
        others = tuple(a for a in range(ref.ndim) if a != axis)
        per_slice = np.mean(diff**2, axis=others) / (np.mean(ref**2, axis=others) + floor)
        worst = max(worst, float(np.mean(per_slice)))
    return worst


def marginal_errors(raw: dict[OpKey, float]) -> dict[OpKey, float]:
    """Each op's error *added* to what came before it, in graph order.

    Activation error accumulates downstream, so raw errors rank late ops first even when
    an early op did the damage. An op's score is how much it raises the largest error
    seen so far; its raw error breaks ties (scaled down so it never outranks a rise).
    """
    scores: dict[OpKey, float] = {}
    worst_so_far = 0.0
    for key, error in raw.items():  # dicts keep the capability's graph order
        scores[key] = max(error - worst_so_far, 0.0) + 1e-3 * error
        worst_so_far = max(worst_so_far, error)
    return scores


def _tuning_space(
    pm: PluginManager, conf: PostTrainingQuantConfig, framework: str, model: Any, calib: Any
) -> TuningSpace:
    """Query the adaptor's capability, apply the backend profile, build the space.

    A backend profile's options go into every tune_cfg; its capability file, if any,
    replaces the adaptor's YAML for the ops the adaptor reported.
    """
    options: dict[str, Any] = {}
    profile = None
    if conf.backend:
        profile = pm.backend_profile(conf.backend)
        if profile.framework != framework:
            raise ConfigError(
                f"backend profile {conf.backend!r} is for {profile.framework}, "
                f"but the model is a {framework} model"
            )
        options.update(profile.options)
    capability = pm.query_capability(framework, model, calib, options)
    if profile is not None and profile.capability_file is not None:
        from .capability_loader import load_capability

        spec = load_capability(profile.capability_file, framework, capability.framework_version)
        capability = spec.build(list(capability.opwise), capability.framework_version)
    return build_tuning_space(
        capability, conf, has_calib_data=calib is not None, extra_options=options
    )


def _require_reiterable(name: str, loader: Any) -> None:
    if loader is not None and iter(loader) is loader:
        raise ConfigError(
            f"the {name} is a one-shot iterator (e.g. a generator); tuning reads it many times",
            hint="pass a list, a numpy array, lpq.ArrayLoader or a framework DataLoader",
        )


def _resolve_metric(pm: PluginManager, metric: str | Metric | None, has_labels: bool) -> Metric:
    if metric is None:
        metric = "top1" if has_labels else "agreement"
    if isinstance(metric, str):
        return pm.create_metric(metric)
    if not isinstance(metric, Metric):
        raise ConfigError(
            f"eval_metric must be a metric name or an object with name, higher_is_better, "
            f"reset, update and result; got {type(metric).__name__}"
        )
    return metric


def fit(
    model: Any,
    conf: PostTrainingQuantConfig | None = None,
    calib_dataloader: Any = None,
    eval_func: Callable[[Any], float] | None = None,
    eval_dataloader: Any = None,
    eval_metric: str | Metric | None = None,
    *,
    postprocess: Postprocess | None = None,
    train_func: Callable[[Any], Any] | None = None,
    eval_iterations: int | None = None,
    workspace: str | Path = "lpq-workspace",
    on_trial: TrialCallback | None = None,
) -> TuningResult:
    """Tune the quantization of ``model`` until the accuracy goal is met.

    :param model: an fp32 model object or a path the installed adaptors recognise.
    :param conf: what to quantize and the accuracy / tuning criteria.
    :param calib_dataloader: calibration data: an iterable of inputs or (inputs, labels),
        a numpy array, or a framework dataloader.
    :param eval_func: ``eval_func(model) -> float``: the user's own accuracy measurement.
    :param eval_dataloader: evaluation data, scored by ``eval_metric`` (a name such as
        ``top1``, ``f1``, ``mse``, or a :class:`lpq.Metric`). Without labels the metric
        compares with the fp32 model's outputs.
    :param workspace: folder for the history; a re-run with the same inputs resumes.
    :return: a :class:`TuningResult`; never ``None``, also when the goal is not met.
    """
    conf = conf or PostTrainingQuantConfig()
    pm = get_plugin_manager()
    calib = as_dataloader(calib_dataloader)
    evaluation_data = as_dataloader(eval_dataloader)
    _require_reiterable("calibration dataloader", calib)
    _require_reiterable("evaluation dataloader", evaluation_data)
    if eval_func is None and evaluation_data is None:
        raise ConfigError(
            "tuning needs a way to measure accuracy",
            hint="pass eval_func=... or eval_dataloader=... (or use lpq.quantize for one "
            "configuration without tuning)",
        )
    framework = conf.framework or pm.detect_framework(model)

    # Evaluation: labels from the data, or the fp32 model's outputs as reference.
    metric: Metric | None = None
    if eval_func is None:
        assert evaluation_data is not None
        first = next(iter(evaluation_data), None)
        if first is None:
            raise ConfigError("the evaluation dataloader is empty", hint="pass non-empty data")
        has_labels = split_batch(first)[1] is not None
        metric = _resolve_metric(pm, eval_metric, has_labels)
        if not has_labels:
            recorder = OutputRecorder()
            pm.evaluate(framework, model, evaluation_data, [recorder], iteration=eval_iterations)
            evaluation_data = ReferenceLoader(evaluation_data, recorder.outputs)
    higher_is_better = conf.accuracy_criterion.higher_is_better
    if higher_is_better is None:
        higher_is_better = metric.higher_is_better if metric is not None else True
    evaluation = Evaluation(
        pm,
        framework,
        eval_func=eval_func,
        dataloader=evaluation_data,
        metric=metric,
        postprocess=postprocess,
        iteration=eval_iterations,
        latency_dataloader=calib if calib is not None else evaluation_data,
        measure_footprint=conf.tuning_criterion.objective == "footprint",
    )

    space = _tuning_space(pm, conf, framework, model, calib)
    if not space.tunable_ops and not space.forced:
        raise TuningError(
            f"the {framework} adaptor found nothing to quantize in this model",
            hint=f"`lpq capability show {framework}` lists the op types it can quantize",
        )
    runner = TrialRunner(
        pm,
        framework,
        model,
        calib,
        evaluation,
        measure_size=conf.tuning_criterion.objective == "modelsize",
        train_func=train_func,
    )
    baseline = runner.baseline()
    logger.info(
        "fp32 baseline: %s = %.4f", metric.name if metric else "accuracy", baseline.accuracy
    )

    key_source = json.dumps(
        {
            "framework": framework,
            "model": model_fingerprint(model, space.ops),
            # In-memory models have no file to hash: a retrained model with the same ops
            # almost always scores differently, so the baseline tells them apart.
            "baseline": repr(baseline.accuracy),
            "config": conf.to_json(),
            "calib": data_fingerprint(calib),
            "eval": data_fingerprint(evaluation_data) if eval_func is None else "eval_func",
            "metric": metric.name if metric else None,
        },
        sort_keys=True,
        default=str,
    )
    run_key = hashlib.sha256(key_source.encode()).hexdigest()[:12]
    history = TuningHistory(
        workspace,
        run_key,
        {
            "framework": framework,
            "model": str(model) if isinstance(model, str | Path) else type(model).__qualname__,
            "config": conf.to_json(),
            "metric": metric.name if metric else "eval_func",
        },
    )
    history.baseline = baseline
    history.write()

    strategy = pm.create_strategy(
        conf.tuning_criterion.strategy, **conf.tuning_criterion.strategy_options
    )
    first_hit = conf.tuning_criterion.exit_policy == "first_hit" and strategy.honours_first_hit
    ctx = _RunContext(
        space=space,
        runner=runner,
        history=history,
        config=conf,
        baseline=baseline,
        higher_is_better=higher_is_better,
        first_hit=first_hit,
        inspect_data=calib or evaluation_data,
        on_trial=on_trial,
    )
    with contextlib.suppress(StopTuning):
        strategy.traverse(ctx)
    return _finish(ctx, framework, metric, conf, history)


def _finish(
    ctx: _RunContext,
    framework: str,
    metric: Metric | None,
    conf: PostTrainingQuantConfig,
    history: TuningHistory,
) -> TuningResult:
    chosen = ctx.best or ctx.best_any
    if chosen is None:
        errors = [t.error for t in history.trials if t.error]
        raise TuningError(
            f"no trial produced a usable model ({len(history.trials)} tried)"
            + (f"; last error: {errors[-1]}" if errors else ""),
            hint=f"the full tracebacks are in {history.path}",
        )
    assert chosen.tune_cfg is not None
    cfg = TuneConfig.from_json(chosen.tune_cfg)
    model = ctx.models.get(chosen.fingerprint)
    if model is None:  # a resumed trial: rebuild its model (no evaluation is repeated)
        model = ctx.runner.quantize(cfg)
    if chosen.size_bytes is None:
        chosen.size_bytes = model_size(ctx.runner.pm, framework, model)
    goal_met = ctx.best is not None
    if not goal_met:
        ctx.stop_reason += (
            "; no configuration met the accuracy goal: returning the most accurate candidate"
        )
    history.write(
        finished=True, best_trial=chosen.index, goal_met=goal_met, stop_reason=ctx.stop_reason
    )
    return TuningResult(
        model=model,
        framework=framework,
        tune_cfg=cfg,
        baseline=ctx.baseline,
        best=chosen,
        trials=list(history.trials),
        goal_met=goal_met,
        metric=metric.name if metric else "eval_func",
        higher_is_better=ctx.higher_is_better,
        objective=conf.tuning_criterion.objective,
        history_path=history.path,
        stop_reason=ctx.stop_reason,
    )


def quantize(
    model: Any,
    conf: PostTrainingQuantConfig | None = None,
    calib_dataloader: Any = None,
    *,
    tune_cfg: TuneConfig | None = None,
) -> QuantizedModel:
    """Quantize ``model`` once, with the default choice for every op (no tuning).

    Overrides, approach and excluded precisions from ``conf`` apply; pass ``tune_cfg`` to
    apply an exact configuration instead (e.g. one from a tuning history).
    """
    conf = conf or PostTrainingQuantConfig()
    pm = get_plugin_manager()
    calib = as_dataloader(calib_dataloader)
    framework = conf.framework or pm.detect_framework(model)
    if tune_cfg is None:
        tune_cfg = _tuning_space(pm, conf, framework, model, calib).default()
    result = pm.quantize(framework, model, tune_cfg, calib)
    return QuantizedModel(model=result, framework=framework, tune_cfg=tune_cfg)
