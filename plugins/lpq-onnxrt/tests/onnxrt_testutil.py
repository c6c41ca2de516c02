"""Helpers shared by lpq-onnxrt's tests (fixtures live in ``conftest.py``).

A module with a unique name rather than ``conftest``: every package's test folder has its
own ``conftest.py``, and pytest runs them all in one session (core's tests do the same
with ``core_testutil``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

import lpq
from lpq.latency import decide as core_decide
from lpq_onnxrt.latency.backend import LatencyDecision, OrtBackend


def decide(
    build: Any, fp32_model: Any, ops: Any, feed: Any, *, margin: float | None = None, **parts: Any
) -> LatencyDecision:
    """Core's search (lpq.latency.decide) on lpq-onnxrt's backend, as
    :func:`lpq_onnxrt.latency.aware.latency_decision` runs it."""
    backend = OrtBackend(build, fp32_model, ops, feed, **parts)
    return LatencyDecision.of(core_decide(backend, margin=margin))


def digits_builds() -> dict[str, Any]:
    """The digits example ready for scripted searches: the prepared model, its ops, the
    default plan (``plan``: name -> config) and ``build(fp32_ops, fmt)``, which builds a
    candidate once (the same candidate is the same object: timers may key on it)."""
    from lpq_onnxrt import model_io, range_choice, ranges
    from lpq_onnxrt.capability import build_capability, load_spec
    from lpq_onnxrt.examples import digits_example
    from lpq_onnxrt.fallback import read_float_inputs
    from lpq_onnxrt.passes.static import static_pass

    files = digits_example()
    with np.load(files["calib"]) as calib:
        loader = lpq.ArrayLoader(calib["input"], batch_size=50)
    prepared = model_io.prepare(str(files["model"]))
    cap = build_capability(prepared.model)
    defaults = {k: cap.default_op_config(k) for k in cap.opwise}
    cfg = lpq.TuneConfig(ops=range_choice.resolved(defaults, "minmax"))
    candidates = ranges.calibration_candidates(prepared.model, load_spec().quantizable_op_types())
    stats = ranges.statistics(prepared.model, prepared.key, candidates, loader, 100)
    built: dict[tuple[frozenset[str], str], onnx.ModelProto] = {}

    def build(
        fp32_ops: frozenset[str], fmt: str, dynamic_ops: frozenset[str] = frozenset()
    ) -> onnx.ModelProto:
        if (fp32_ops, fmt) not in built:
            ops = {n: c for (n, _), c in cfg.ops.items() if n not in fp32_ops}
            model = model_io.copy_model(prepared.model)
            if ops:
                model, _ = static_pass(model, ops, cfg, stats, fmt)
            built[fp32_ops, fmt] = read_float_inputs(model, prepared.model, list(fp32_ops))
        return built[fp32_ops, fmt]

    plan = {name: c for (name, _), c in cfg.ops.items()}
    return {"prepared": prepared, "ops": list(cap.opwise), "build": build, "plan": plan}


def decoder_io(
    vocab: int, layers: int, kv_heads: int, head_dim: int, *, position_ids: bool = False
) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """Inputs and outputs of a decoder with a KV cache, named as the genai builder and
    optimum export them: ``input_ids``, ``attention_mask`` (``position_ids``),
    ``past_key_values.{i}.key/value`` -> ``logits``, ``present.{i}.key/value``."""
    from onnx import TensorProto, helper

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", i64, ["batch", "total"]),
    ]
    if position_ids:
        inputs.append(helper.make_tensor_value_info("position_ids", i64, ["batch", "seq"]))
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", "seq", vocab])]
    for i in range(layers):
        for kind in ("key", "value"):
            shape = ["batch", kv_heads, "past", head_dim]
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32, shape))
            shape = ["batch", kv_heads, "total", head_dim]
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f32, shape))
    return inputs, outputs


class KeepPredictions:
    """A metric that keeps every prediction it is given (``seen``), as a metric holding a
    reference would: what evaluation hands metrics, checked as they got it."""

    name, higher_is_better = "keep", True

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def update(self, preds: Any, labels: Any) -> None:
        self.seen.append(preds)

    def reset(self) -> None:
        pass

    def result(self) -> float:
        return 0.0
