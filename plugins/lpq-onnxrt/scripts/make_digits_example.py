"""Build the built-in ``digits`` example: a small CNN trained on scikit-learn's digits.

Writes ``lpq_onnxrt/examples/digits/{model.onnx,calib.npz,eval.npz}``. The weights are
trained with torch, but the ONNX graph is written directly with ``onnx.helper`` so that the
IR version and opset are explicit (ORT 1.31 rejects the IR 14 / opset 28 that onnx 1.23
stamps by default) and no exporter quirk ends up in a file every user runs first.

Run from the repository root::

    .venv/bin/python plugins/lpq-onnxrt/scripts/make_digits_example.py
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parents[1] / "lpq_onnxrt" / "examples" / "digits"
OPSET = 17
IR_VERSION = 8
INPUT = "input"


class DigitsNet(torch.nn.Module):
    """Conv-Conv-Pool-Gemm-MatMul: one of each op type the adaptor quantizes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = torch.nn.Linear(64 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def train(x: np.ndarray, y: np.ndarray, epochs: int, seed: int) -> DigitsNet:
    torch.manual_seed(seed)
    net = DigitsNet()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        perm = torch.randperm(len(xt))
        for start in range(0, len(xt), 64):
            idx = perm[start : start + 64]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    return net.eval()


def to_onnx(net: DigitsNet) -> onnx.ModelProto:
    """Write the trained net as an ONNX graph with explicit names, IR version and opset."""
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in net.state_dict().items()}
    inits = [
        numpy_helper.from_array(sd["conv1.weight"], "conv1.weight"),
        numpy_helper.from_array(sd["conv1.bias"], "conv1.bias"),
        numpy_helper.from_array(sd["conv2.weight"], "conv2.weight"),
        numpy_helper.from_array(sd["conv2.bias"], "conv2.bias"),
        numpy_helper.from_array(sd["fc1.weight"], "fc1.weight"),  # (64, 512): Gemm transB=1
        numpy_helper.from_array(sd["fc1.bias"], "fc1.bias"),
        numpy_helper.from_array(np.ascontiguousarray(sd["fc2.weight"].T), "fc2.weight_t"),
        numpy_helper.from_array(sd["fc2.bias"], "fc2.bias"),
        numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "flat_shape"),
    ]
    nodes = [
        helper.make_node(
            "Conv",
            [INPUT, "conv1.weight", "conv1.bias"],
            ["c1"],
            name="conv1",
            pads=[1, 1, 1, 1],
            kernel_shape=[3, 3],
        ),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "Conv",
            ["r1", "conv2.weight", "conv2.bias"],
            ["c2"],
            name="conv2",
            pads=[1, 1, 1, 1],
            kernel_shape=[3, 3],
        ),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node(
            "MaxPool", ["r2"], ["p2"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("Reshape", ["p2", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["g1"], name="fc1", transB=1),
        helper.make_node("Relu", ["g1"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "fc2.weight_t"], ["m2"], name="fc2_matmul"),
        helper.make_node("Add", ["m2", "fc2.bias"], ["logits"], name="fc2_add"),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_cnn",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="lpq-digits"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(args.seed).permutation(len(x))
    x, y = x[order], y[order]
    eval_x, eval_y = x[:400], y[:400]
    calib_x = x[400:600]
    train_x, train_y = x[400:], y[400:]

    net = train(train_x, train_y, args.epochs, args.seed)
    model = to_onnx(net)
    with torch.no_grad():
        acc = float((net(torch.from_numpy(eval_x)).argmax(1).numpy() == eval_y).mean())
    print(f"held-out top-1 (torch): {acc:.4f}")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model.onnx").write_bytes(model.SerializeToString())
    for name, arrays in (
        ("calib.npz", {INPUT: calib_x}),
        ("eval.npz", {INPUT: eval_x, "labels": eval_y}),
    ):
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        (args.out / name).write_bytes(buffer.getvalue())

    import onnxruntime as ort

    session = ort.InferenceSession(str(args.out / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(None, {INPUT: eval_x})[0]
    print(f"held-out top-1 (onnxruntime): {float((logits.argmax(1) == eval_y).mean()):.4f}")
    for file in sorted(args.out.iterdir()):
        print(f"{file}: {file.stat().st_size} bytes")


if __name__ == "__main__":
    main()
