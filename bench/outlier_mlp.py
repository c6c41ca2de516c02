"""A real model where a few ops carry most of the quantization error.

An MLP trained on scikit-learn's digits, then made "outlier-heavy" the way large
language models are: in a few layers one hidden unit is scaled up by ``factor`` and the
next layer's matching weights down by the same factor. ReLU is positively homogeneous,
so the fp32 function is unchanged, but that layer's output range grows by ``factor``:
per-tensor activation quantization (and per-output-channel weight quantization of the
next layer) then loses almost all resolution there, and only there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def build(
    path: Path,
    *,
    hidden: int = 256,
    layers: int = 8,
    outlier_layers: tuple[int, ...] = (2, 5),
    factor: float = 300.0,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    train, calib, evaluation = slice(0, 1000), slice(1000, 1200), slice(1200, None)
    mlp = MLPClassifier(hidden_layer_sizes=(hidden,) * layers, max_iter=300, random_state=seed)
    mlp.fit(x[train], y[train])
    weights = [w.astype(np.float32).copy() for w in mlp.coefs_]
    biases = [b.astype(np.float32).copy() for b in mlp.intercepts_]
    # The most active unit of each chosen layer becomes the outlier, so that calibration
    # sees it (a unit ReLU keeps at zero would be harmless).
    hidden_out = x[train]
    activity = []
    for w, b in zip(weights[:-1], biases[:-1]):
        hidden_out = np.maximum(hidden_out @ w + b, 0)
        activity.append(hidden_out.mean(axis=0))
    for layer in outlier_layers:
        unit = int(np.argmax(activity[layer]))
        weights[layer][:, unit] *= factor
        biases[layer][unit] *= factor
        weights[layer + 1][unit, :] /= factor

    nodes, inits, prev = [], [], "input"
    for i, (w, b) in enumerate(zip(weights, biases)):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"fc{i}"),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"z{i}"], name=f"bias{i}"),
        ]
        prev = f"z{i}"
        if i < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"h{i}"], name=f"relu{i}"))
            prev = f"h{i}"
    graph = helper.make_graph(
        nodes,
        "outlier_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return {"calib": x[calib], "eval_x": x[evaluation], "eval_y": y[evaluation]}
