"""Helpers shared by lpq-onnxrt's latency tests (fixtures live in ``conftest.py``).

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
