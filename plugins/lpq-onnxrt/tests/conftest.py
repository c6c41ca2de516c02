"""Fixtures for the adaptor's tests: the digits example model and small built graphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq_onnxrt.examples import digits_example


@pytest.fixture(scope="session")
def digits() -> dict[str, Any]:
    """The digits example: paths plus its calibration and evaluation arrays."""
    files = digits_example()
    with np.load(files["calib"]) as calib, np.load(files["eval"]) as ev:
        return {
            **files,
            "calib_x": calib["input"],
            "eval_x": ev["input"],
            "eval_y": ev["labels"],
        }


@pytest.fixture
def lpq_sample_model(digits: dict[str, Any]) -> Path:
    """A small trained CNN (Conv, Gemm, MatMul) as an .onnx file: IR 8, opset 17."""
    return Path(digits["model"])


@pytest.fixture
def lpq_sample_data(digits: dict[str, Any]) -> lpq.ArrayLoader:
    """160 held-out digits with labels, in batches of 32."""
    return lpq.ArrayLoader(digits["eval_x"][:160], digits["eval_y"][:160], batch_size=32)


@pytest.fixture
def lpq_misfit_data(digits: dict[str, Any]) -> lpq.ArrayLoader:
    """Inputs of the wrong spatial size (10x10 instead of 8x8)."""
    x = np.zeros((8, 1, 10, 10), dtype=np.float32)
    return lpq.ArrayLoader(x, np.zeros(8, dtype=np.int64), batch_size=4)


@pytest.fixture
def calib_loader(digits: dict[str, Any]) -> lpq.ArrayLoader:
    return lpq.ArrayLoader(digits["calib_x"], batch_size=50)


@pytest.fixture
def eval_loader(digits: dict[str, Any]) -> lpq.ArrayLoader:
    return lpq.ArrayLoader(digits["eval_x"], digits["eval_y"], batch_size=100)


def _mlp_proto(calib_x: np.ndarray, labels: np.ndarray, opset: int = 17) -> Any:
    """A 64-128-10 MatMul/Relu/MatMul classifier for the digits, with a random first layer
    and a ridge-regression read-out (deterministic, about 95% top-1). No Add after the
    MatMuls, so ORT's basic optimizations keep them as MatMul (not Gemm)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.25, (64, 128)).astype(np.float32)
    x = calib_x.reshape(len(calib_x), -1)
    h = np.maximum(x @ w1, 0)
    onehot = np.eye(10, dtype=np.float32)[labels]
    w2 = np.linalg.solve(h.T @ h + 1.0 * np.eye(128), h.T @ onehot).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["flat"], name="flatten"),
            helper.make_node("MatMul", ["flat", "w1"], ["h"], name="mm1"),
            helper.make_node("Relu", ["h"], ["hr"], name="relu"),
            helper.make_node("MatMul", ["hr", "w2"], ["logits"], name="mm2"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array([-1, 64], dtype=np.int64), "shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="session")
def mlp_model(digits: dict[str, Any]) -> Any:
    """The MLP, fitted on the last 997 digits (not the 400 eval ones)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], data.target[order]
    return _mlp_proto(x[400:], y[400:])


@pytest.fixture(autouse=True, scope="session")
def _latency_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Latency-aware decisions are cached on disk: keep the tests' cache out of ~/.cache."""
    import os

    folder = tmp_path_factory.mktemp("lpq-cache")
    previous = os.environ.get("LPQ_CACHE_DIR")
    os.environ["LPQ_CACHE_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("LPQ_CACHE_DIR", None)
    else:
        os.environ["LPQ_CACHE_DIR"] = previous


@pytest.fixture
def digits_static(lpq_sample_model: Path, calib_loader: lpq.ArrayLoader) -> dict[str, Any]:
    """What a static build of the digits model needs: the prepared model, its capability,
    the default plan with the range algorithm resolved (``static_pass`` takes resolved
    algorithms; quantize resolves ``auto``) and the calibration statistics."""
    from lpq_onnxrt import model_io, range_choice, ranges
    from lpq_onnxrt.capability import build_capability, load_spec

    prepared = model_io.prepare(str(lpq_sample_model))
    cap = build_capability(prepared.model)
    defaults = {k: cap.default_op_config(k) for k in cap.opwise}
    cfg = lpq.TuneConfig(ops=range_choice.resolved(defaults, "minmax"))
    candidates = ranges.calibration_candidates(prepared.model, load_spec().quantizable_op_types())
    stats = ranges.statistics(prepared.model, prepared.key, candidates, calib_loader, 100)
    return {"prepared": prepared, "cap": cap, "cfg": cfg, "stats": stats}
