"""A scripted, framework-free adaptor for testing strategies and the tuner.

Its "model" is a :class:`FakeModel`: a list of ops with a scripted accuracy cost each.
Quantizing an op costs its ``sensitivity`` in accuracy and saves latency, so a strategy's
behaviour can be checked exactly, with no framework installed. Never proof that a real
adaptor works: real adaptors pass :class:`lpq.testing.AdaptorConformance`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lpq import (
    AdaptorInfo,
    DataError,
    EvalResult,
    Inspection,
    LatencyMeasurer,
    Metric,
    ModelError,
    TuneConfig,
    hookimpl,
    load_capability,
    split_batch,
    write_json,
)

FRAMEWORK = "fake"

CAPABILITY_YAML = """\
- version:
    name: default
  precisions: [int8, uint8, fp32, bf16]
  ops:
    int8: [Conv, MatMul]
    bf16: [Conv, MatMul]
    fp32: ["*"]
  capabilities:
    int8:
      static:
        default:
          weight: {dtype: [int8], scheme: [sym], granularity: [per_channel, per_tensor]}
          activation: {dtype: [uint8], scheme: [asym], algorithm: [minmax, kl]}
      dynamic:
        MatMul:
          weight: {dtype: [int8], scheme: [sym]}
          activation: {dtype: [uint8], scheme: [asym]}
"""


@dataclass
class FakeModel:
    """``ops`` as (name, op_type); ``sensitivity[name]``: accuracy lost if quantized."""

    ops: list[tuple[str, str]]
    sensitivity: dict[str, float] = field(default_factory=dict)
    base_accuracy: float = 0.9
    base_latency_ms: float = 10.0
    #: Quantizing with the ``kl`` algorithm halves an op's cost (to exercise op-type tuning).
    kl_helps: bool = False


@dataclass
class FakeQuantizedModel:
    source: FakeModel
    tune_cfg: TuneConfig

    def accuracy(self) -> float:
        cost = 0.0
        for (name, _), cfg in self.tune_cfg.ops.items():
            if cfg.quantized:
                weight = self.source.sensitivity.get(name, 0.0)
                if self.source.kl_helps and cfg.activation and cfg.activation.algorithm == "kl":
                    weight /= 2
                cost += weight
        return self.source.base_accuracy - cost

    def latency_ms(self) -> float:
        total = max(len(self.source.ops), 1)
        return self.source.base_latency_ms * (1 - 0.7 * len(self.tune_cfg.quantized_ops()) / total)


class FakeAdaptorPlugin:
    """Register with ``lpq_plugin(FakeAdaptorPlugin(tmp_path))``; counts calls."""

    def __init__(
        self, folder: Path, *, inspect: bool = True, interrupt_at_quantize: int | None = None
    ) -> None:
        self.capability_file = Path(folder) / "fake-capability.yaml"
        self.capability_file.write_text(CAPABILITY_YAML)
        self.inspect = inspect
        #: Simulate Ctrl-C during the n-th quantize call (to test resume).
        self.interrupt_at_quantize = interrupt_at_quantize
        self.calls: dict[str, int] = {}

    def _count(self, hook: str) -> None:
        self.calls[hook] = self.calls.get(hook, 0) + 1

    @hookimpl
    def lpq_register_adaptors(self, register: Any) -> None:
        register(AdaptorInfo(FRAMEWORK, "numpy", [self.capability_file], "scripted fake"))

    @hookimpl
    def lpq_detect_framework(self, model: Any) -> str | None:
        return FRAMEWORK if isinstance(model, FakeModel | FakeQuantizedModel) else None

    @hookimpl
    def lpq_query_fw_capability(
        self, framework: str, model: Any, dataloader: Any, options: dict[str, Any]
    ) -> Any:
        if framework != FRAMEWORK:
            return None
        self._count("query")
        spec = load_capability(self.capability_file, FRAMEWORK, None)
        return spec.build(model.ops, None)

    @hookimpl
    def lpq_quantize(
        self,
        framework: str,
        model: Any,
        tune_cfg: TuneConfig,
        calib_dataloader: Any,
        train_func: Any,
    ) -> Any:
        if framework != FRAMEWORK:
            return None
        self._count("quantize")
        if self.calls["quantize"] == self.interrupt_at_quantize:
            raise KeyboardInterrupt
        return FakeQuantizedModel(model, tune_cfg)

    @hookimpl
    def lpq_evaluate(
        self,
        framework: str,
        model: Any,
        dataloader: Iterable[Any],
        postprocess: Any,
        metrics: Sequence[Metric],
        measurer: LatencyMeasurer | None,
        iteration: int | None,
    ) -> Any:
        if framework != FRAMEWORK:
            return None
        self._count("evaluate")
        items = list(dataloader)
        if not items:
            raise DataError("empty dataloader")
        accuracy = (
            model.accuracy() if isinstance(model, FakeQuantizedModel) else (model.base_accuracy)
        )
        latency = (
            model.latency_ms() if isinstance(model, FakeQuantizedModel) else (model.base_latency_ms)
        )
        for metric in metrics:
            metric.reset()
        for item in items:
            inputs, labels = split_batch(item)
            # Scores whose top-1 matches the labels for a fraction `accuracy` of samples.
            labels = np.asarray(labels if labels is not None else np.zeros(len(inputs), int))
            fraction = accuracy
            if labels.ndim > 1:  # fp32 reference outputs instead of labels: agreement
                labels = labels.argmax(axis=-1)
                base = (
                    model.source.base_accuracy
                    if isinstance(model, FakeQuantizedModel)
                    else (model.base_accuracy)
                )
                fraction = min(accuracy / base, 1.0)
            n = len(labels)
            correct = round(fraction * n)
            preds = np.zeros((n, 10), np.float32)
            preds[np.arange(n), labels % 10] = 1.0
            preds[correct:, :] = np.roll(preds[correct:, :], 1, axis=1)
            for metric in metrics:
                metric.update(preds, labels)
        if measurer is not None:
            measurer.samples.append(latency / 1e3)
        return EvalResult(
            {m.name: m.result() for m in metrics},
            latency_ms=measurer.median_ms if measurer else None,
            batches=len(items),
            samples=len(items),
        )

    @hookimpl
    def lpq_inspect_tensor(
        self,
        framework: str,
        model: Any,
        dataloader: Any,
        op_names: Any,
        kind: str,
        iteration: int | None,
    ) -> Any:
        if framework != FRAMEWORK or not self.inspect:
            return None
        self._count("inspect")
        source = model.source if isinstance(model, FakeQuantizedModel) else model
        # Like real activations, error accumulates along the chain of ops: an op's
        # output carries the damage of every quantized op before it.
        activations = {}
        damage = 0.0
        for name, _ in source.ops:
            if isinstance(model, FakeQuantizedModel):
                cfg = next(c for (n, _), c in model.tune_cfg.ops.items() if n == name)
                if cfg.quantized:
                    damage += source.sensitivity.get(name, 0.0)
            value = np.ones((2, 4), np.float32)
            value[:, 0] += np.float32(np.sqrt(damage))
            activations[name] = [value]
        return Inspection(activations=activations)

    @hookimpl
    def lpq_save_model(self, framework: str, model: Any, path: Path) -> Any:
        if framework != FRAMEWORK:
            return None
        target = Path(path).with_suffix(".json")
        cfg = model.tune_cfg.to_json() if isinstance(model, FakeQuantizedModel) else None
        write_json(
            target,
            {
                "tune_cfg": cfg,
                "ops": len(model.source.ops)
                if isinstance(model, FakeQuantizedModel)
                else len(model.ops),
            },
        )
        return target

    @hookimpl
    def lpq_load_model(self, framework: str, path: Path) -> Any:
        if framework != FRAMEWORK:
            return None
        raise ModelError("the fake adaptor cannot load models")
