"""Calibration runs of a small model return activations in proportion to the model
(``calibration.collect.run_budget``), not up to the whole memory budget: a batch runs in
chunks of samples, with the same statistics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest


def _mlp(width: int) -> Any:
    """x[N,8] -> MatMul w1[8,width] -> Relu -> MatMul w2[width,4] -> y."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    weights = {
        "w1": rng.normal(size=(8, width)).astype(np.float32),
        "w2": rng.normal(size=(width, 4)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu1"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_run_budget_scales_with_the_weights_between_a_floor_and_the_budget():
    from lpq_onnxrt.calibration.collect import RUN_FLOOR, RUN_WEIGHTS, run_budget

    small, large = _mlp(16), _mlp(1 << 16)  # 768 bytes, 3 MiB of weights
    assert run_budget(small, 1 << 30) == RUN_FLOOR
    assert run_budget(large, 1 << 40) == max(RUN_FLOOR, RUN_WEIGHTS * 12 * 4 * (1 << 16))
    assert run_budget(small, 1 << 20) == 1 << 20  # never above the budget


def test_a_small_model_runs_its_batch_in_chunks_with_the_same_statistics(monkeypatch):
    from lpq_onnxrt.calibration import collect as calibration
    from lpq_onnxrt.calibration import collect_statistics

    model = _mlp(16)
    names = ["h", "r", "y"]
    per_sample = 4 * (16 + 16 + 4)
    weights = 4 * (8 * 16 + 16 * 4)
    rng = np.random.default_rng(5)
    batches = [rng.normal(size=(64, 8)).astype(np.float32) for _ in range(3)]
    fetched: list[int] = []
    original = calibration._run

    def recording(session: Any, group: Any, feed: Any, index: int) -> Any:
        outputs = original(session, group, feed, index)
        fetched.append(sum(o.nbytes for o in outputs))
        return outputs

    monkeypatch.setattr(calibration, "_run", recording)
    monkeypatch.setattr(calibration, "RUN_FLOOR", 0)  # the weights alone set the chunk
    chunked = collect_statistics(model, names, ({"x": b} for b in batches))
    chunk = calibration.RUN_WEIGHTS * weights // per_sample  # samples per run
    assert 1 < chunk < 64
    assert max(fetched) <= calibration.RUN_WEIGHTS * weights
    assert len(fetched) == 1 + 3 * -(-64 // chunk)  # the probe, then chunks of each batch
    fetched.clear()
    monkeypatch.setattr(calibration, "RUN_FLOOR", 1 << 30)
    whole = collect_statistics(model, names, ({"x": b} for b in batches))
    assert len(fetched) == 1 + 3  # the probe, then each batch in one run
    for name in names:
        for algorithm in ("minmax", "kl", "percentile"):
            assert chunked.compute_range(name, algorithm, symmetric=False) == (
                whole.compute_range(name, algorithm, symmetric=False)
            )
        assert chunked.count(name) == whole.count(name)


def test_calibration_sessions_do_not_spin_and_the_callers_options_are_untouched(monkeypatch):
    import onnxruntime as ort

    from lpq_onnxrt.calibration import collect as calibration
    from lpq_onnxrt.calibration import collect_statistics

    given = ort.SessionOptions()
    given.intra_op_num_threads = 1
    made: list[Any] = []
    original = calibration._unoptimized_copy

    def remember(options: Any) -> Any:
        made.append(original(options))
        return made[-1]

    monkeypatch.setattr(calibration, "_unoptimized_copy", remember)
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    collect_statistics(_mlp(16), ["h"], [{"x": x}], session_options=given)
    (options,) = made
    assert options.get_session_config_entry(calibration.SPINNING) == "0"
    assert options.intra_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(RuntimeError):  # ORT's "does not have configuration with key"
        given.get_session_config_entry(calibration.SPINNING)
    assert given.graph_optimization_level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL
