"""The static plan narrows ranges only where ``lpq.ranges.narrowing_pays`` says so: on
the calibration statistics' count of activation values."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import lpq

FW = "onnxrt"


def _wide_model() -> onnx.ModelProto:
    """x -> MatMul -> y -> Tanh, one column of y 30x the others: narrowing y's range pays
    (as in test_onnxrt_range_choice)."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.5, (16, 8)).astype(np.float32)
    w[:, 0] *= 30
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
            helper.make_node("Tanh", ["y"], ["t"], name="tanh"),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n", 8])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _quantize(pm: Any) -> Any:
    x = np.random.default_rng(1).normal(0, 1, (256, 16)).astype(np.float32)
    loader = lpq.ArrayLoader(x, batch_size=16)
    model = _wide_model()
    cap = pm.query_capability(FW, model, loader, {})
    cfg = lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=256,
        options={"latency_aware": False},
    )
    return pm.quantize(FW, model, cfg, loader)


def test_narrowing_runs_within_the_value_budget_and_not_above(monkeypatch):
    from lpq_onnxrt.passes import static_plan

    pm = lpq.get_plugin_manager()
    seen: list[tuple[int, int]] = []
    original = static_plan.range_choice.narrowing_pays

    def recorded(ops: int, values: int) -> bool:
        seen.append((ops, values))
        return bool(original(ops, values))

    monkeypatch.setattr(static_plan.range_choice, "narrowing_pays", recorded)
    narrowed = _quantize(pm).range_choice
    # x and y over 256 samples: the values the calibration computed
    assert seen and seen[-1] == (1, 256 * (16 + 8))
    assert narrowed["narrowed"] == {"y": narrowed["narrowed"]["y"]}
    assert narrowed["narrowed_error"] is not None
    monkeypatch.setattr("lpq.ranges.choice.NARROW_MAX_VALUES", seen[-1][1] - 1)
    plain = _quantize(pm).range_choice
    assert plain["narrowed"] == {} and plain["narrowed_error"] is None  # not run
    assert plain["errors"] == narrowed["errors"]  # the algorithm choice is unchanged
