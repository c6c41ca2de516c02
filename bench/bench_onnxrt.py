"""Benchmark: lpq's ONNX Runtime int8 against fp32 and ORT's own quantize_static.

Two models built here with random (He-initialised) weights, so nothing is downloaded:

* ``resnet``: a ResNet-style conv net (stem, residual blocks at 56x56/64 channels and
  28x28/128 channels, global pool, classifier), input 3x112x112;
* ``mlp``: a transformer-style MatMul stack (seq 128, hidden 384, MatMul+Add+Gelu+MatMul+Add
  with residuals and LayerNorm).

For each, at batch 1 and 16, the variants run interleaved in one process (timings on a
shared machine are noisy; compare the ratios; one intra-op thread by default): fp32,
lpq int8 (the capability defaults: what ``lpq tune`` tries first), ORT ``quantize_static``
with its defaults (QDQ, signed int8 activations) and ORT with U8S8 (uint8 activations,
int8 weights). Reported: median latency, speedup vs fp32, model size and output error
vs fp32 (relative L2, cosine).

Run: ``.venv/bin/python bench/bench_onnxrt.py`` (``--quick`` for fewer repetitions).
Writes ``bench/results/onnxrt.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import lpq

OPSET = 17
RESULTS = Path(__file__).resolve().parent / "results" / "onnxrt.json"


class _Graph:
    """A tiny graph builder with deterministic He-initialised weights."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, array: np.ndarray, prefix: str) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out + "_node", **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, gain: float = 1.0) -> str:
        std = gain * np.sqrt(2.0 / (cin * k * k))
        w = self.const(self.rng.normal(0, std, (cout, cin, k, k)), "w")
        b = self.const(self.rng.normal(0, 0.01, (cout,)), "b")
        pad = k // 2
        return self.node(
            "Conv", [x, w, b], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4
        )

    def model(self, inputs: list[Any], outputs: list[Any], name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def resnet_model(seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    x = g.node("Relu", [g.conv("input", 3, 64, 7, stride=2)])  # 56x56
    for cin, cout, blocks in ((64, 64, 2), (64, 128, 2)):
        for index in range(blocks):
            stride = 2 if cin != cout and index == 0 else 1
            shortcut = x if stride == 1 and cin == cout else g.conv(x, cin, cout, 1, stride)
            y = g.node("Relu", [g.conv(x, cin, cout, 3, stride)])
            y = g.conv(y, cout, cout, 3, gain=0.5)
            x = g.node("Relu", [g.node("Add", [y, shortcut])])
            cin = cout
    pooled = g.node("GlobalAveragePool", [x])
    flat = g.node("Flatten", [pooled], axis=1)
    w = g.const(g.rng.normal(0, np.sqrt(1.0 / 128), (1000, 128)), "fc_w")
    b = g.const(np.zeros(1000), "fc_b")
    g.nodes.append(helper.make_node("Gemm", [flat, w, b], ["logits"], name="fc", transB=1))
    return g.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 112, 112])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])],
        "resnet_style",
    )


def mlp_model(seed: int = 1, hidden: int = 384, layers: int = 4) -> onnx.ModelProto:
    g = _Graph(seed)
    x = "input"
    ones = g.const(np.ones(hidden), "ln_scale")
    zeros = g.const(np.zeros(hidden), "ln_bias")
    half = g.const(np.array(0.5), "half")
    one = g.const(np.array(1.0), "one")
    inv_sqrt2 = g.const(np.array(1 / np.sqrt(2.0)), "inv_sqrt2")
    for _ in range(layers):
        h = g.node("LayerNormalization", [x, ones, zeros], axis=-1)
        w1 = g.const(g.rng.normal(0, np.sqrt(2.0 / hidden), (hidden, 4 * hidden)), "w1")
        b1 = g.const(g.rng.normal(0, 0.01, (4 * hidden,)), "b1")
        h = g.node("Add", [g.node("MatMul", [h, w1]), b1])
        # Gelu written with Erf (opset 17 has no Gelu op; ORT fuses the pattern).
        erf = g.node("Erf", [g.node("Mul", [h, inv_sqrt2])])
        h = g.node("Mul", [g.node("Mul", [h, half]), g.node("Add", [erf, one])])
        w2 = g.const(g.rng.normal(0, np.sqrt(1.0 / (4 * hidden)), (4 * hidden, hidden)), "w2")
        b2 = g.const(g.rng.normal(0, 0.01, (hidden,)), "b2")
        h = g.node("Add", [g.node("MatMul", [h, w2]), b2])
        x = g.node("Add", [x, h])
    g.nodes.append(helper.make_node("Identity", [x], ["output"], name="out"))
    return g.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 128, hidden])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 128, hidden])],
        "mlp_style",
    )


def lpq_int8(model: onnx.ModelProto, calib: np.ndarray) -> onnx.ModelProto:
    """lpq with the capability defaults (what a tuning run tries first)."""
    pm = lpq.get_plugin_manager()
    loader = lpq.ArrayLoader(calib, batch_size=8)
    cap = pm.query_capability("onnxrt", model, loader, {})
    cfg = lpq.TuneConfig(
        ops={key: cap.default_op_config(key) for key in cap.opwise},
        calib_sampling_size=len(calib),
    )
    return pm.quantize("onnxrt", model, cfg, loader).proto


def ort_static(model: onnx.ModelProto, calib: np.ndarray, u8s8: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"input": calib[i : i + 8]} for i in range(0, len(calib), 8)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    kwargs: dict[str, Any] = {}
    if u8s8:
        kwargs = {"activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.onnx"
        # A copy: quantize_static moves the initializers of a ModelProto argument to
        # external data in place, corrupting the caller's model.
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        quantize_static(copy, out, Reader(), **kwargs)
        return onnx.load(str(out))


def _error(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    a, b = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12))
    cos = float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))
    return {"rel_l2": rel, "cosine": cos}


def bench_model(
    name: str,
    model: onnx.ModelProto,
    input_shape: tuple[int, ...],
    batches: list[int],
    reps: int,
    calib_n: int,
    threads: int,
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(42)
    calib = rng.normal(0, 1, (calib_n, *input_shape)).astype(np.float32)
    t0 = time.perf_counter()
    variants = {"fp32": model}
    variants["lpq int8"] = lpq_int8(model, calib)
    t1 = time.perf_counter()
    variants["ort default"] = ort_static(model, calib, u8s8=False)
    variants["ort u8s8"] = ort_static(model, calib, u8s8=True)
    print(
        f"[{name}] quantized: lpq {t1 - t0:.1f}s, ort {time.perf_counter() - t1:.1f}s",
        file=sys.stderr,
    )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    sessions = {
        key: ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for key, m in variants.items()
    }
    rows = []
    for batch in batches:
        x = rng.normal(0, 1, (batch, *input_shape)).astype(np.float32)
        outs = {key: s.run(None, {"input": x})[0] for key, s in sessions.items()}  # warm-up
        times: dict[str, list[float]] = {key: [] for key in sessions}
        for _ in range(reps):
            for key, session in sessions.items():  # interleaved
                start = time.perf_counter()
                session.run(None, {"input": x})
                times[key].append(time.perf_counter() - start)
        fp32_ms = statistics.median(times["fp32"]) * 1e3
        for key in sessions:
            ms = statistics.median(times[key]) * 1e3
            rows.append(
                {
                    "model": name,
                    "batch": batch,
                    "variant": key,
                    "latency_ms": round(ms, 3),
                    "speedup_vs_fp32": round(fp32_ms / ms, 3),
                    "size_mb": round(variants[key].ByteSize() / 2**20, 3),
                    **{k: round(v, 5) for k, v in _error(outs["fp32"], outs[key]).items()},
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--models", default="resnet,mlp")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads (default 1: stable ratios on a shared machine; "
        "0 = ORT default, all cores)",
    )
    args = parser.parse_args()
    reps = {1: 10, 16: 4} if args.quick else {1: 30, 16: 10}
    rows: list[dict[str, Any]] = []
    if "resnet" in args.models:
        model = resnet_model()
        for batch in (1, 16):
            rows += bench_model(
                "resnet", model, (3, 112, 112), [batch], reps[batch], 32, args.threads
            )
    if "mlp" in args.models:
        model = mlp_model()
        for batch in (1, 16):
            rows += bench_model("mlp", model, (128, 384), [batch], reps[batch], 32, args.threads)
    header = (
        f"{'model':7} {'batch':>5} {'variant':12} {'ms':>9} {'x fp32':>7} {'MB':>7} "
        f"{'rel L2':>8} {'cosine':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['model']:7} {r['batch']:>5} {r['variant']:12} {r['latency_ms']:>9.2f} "
            f"{r['speedup_vs_fp32']:>7.2f} {r['size_mb']:>7.2f} {r['rel_l2']:>8.4f} "
            f"{r['cosine']:>8.4f}"
        )
    lpq.write_json(
        RESULTS,
        {
            "onnxruntime": ort.__version__,
            "intra_op_threads": args.threads or "ORT default (all cores)",
            "rows": rows,
        },
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
