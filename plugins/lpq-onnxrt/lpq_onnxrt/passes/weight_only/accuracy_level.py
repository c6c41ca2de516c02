"""Choosing MatMulNBits' ``accuracy_level`` by measurement.

``accuracy_level`` 4 lets ORT quantize the activations to int8 inside MatMulNBits; on
SmolLM2 that is where the whole int4 decode speedup comes from (21 ms vs 70 ms a token at
level 0), but it adds activation rounding error, and on CPUs without fast int8 dot
products it need not be faster. So lpq times both levels on the model's own packed
weights at batch 1 (one row, one intra-op thread, interleaved rounds) and keeps level 4
only when it is faster and its extra output error stays below half the weight
quantization's own error. The decision is cached per (K, N, bits, block, scheme).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from lpq.weight_only import BlockQuantized, dequantize_blocks

from .nodes import MS_DOMAIN

log = logging.getLogger(__name__)

LEVELS = (0, 4)
_ROUNDS = 5
_RUNS = 20
_CACHE: dict[tuple[int, int, int, int, bool], dict[str, Any]] = {}


def _one_node(quantized: BlockQuantized, level: int) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from lpq.weight_only import pack_matmulnbits

    packed = pack_matmulnbits(quantized)
    inits = [
        numpy_helper.from_array(packed.b, "B"),
        numpy_helper.from_array(packed.scales, "scales"),
    ]
    names = ["x", "B", "scales"]
    if packed.zero_points is not None:
        inits.append(numpy_helper.from_array(packed.zero_points, "zp"))
        names.append("zp")
    node = helper.make_node(
        "MatMulNBits", names, ["y"], domain=MS_DOMAIN, accuracy_level=level, **packed.attributes()
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, packed.k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, packed.n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)]
    )
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _time(session: Any, x: np.ndarray) -> float:
    start = time.perf_counter()
    for _ in range(_RUNS):
        session.run(None, {"x": x})
    return (time.perf_counter() - start) / _RUNS * 1e3


def measure(
    weight: np.ndarray, quantized: BlockQuantized, activations: np.ndarray | None = None
) -> dict[str, Any]:
    """Time and error of each level for one layer: ``{"chosen", "ms", "extra_error"}``."""
    k, n = quantized.shape
    key = (k, n, quantized.bits, quantized.block_size, quantized.symmetric)
    if key in _CACHE:
        return _CACHE[key]
    rng = np.random.default_rng(0)
    x = activations[:64] if activations is not None and len(activations) else None
    if x is None:
        x = rng.standard_normal((64, k)).astype(np.float32)
    sessions = {level: _one_node(quantized, level) for level in LEVELS}
    outputs = {level: sessions[level].run(None, {"x": x})[0] for level in LEVELS}
    deq = dequantize_blocks(
        quantized.codes, quantized.scales, quantized.zero_points, quantized.block_size
    )
    weight_error = float(np.linalg.norm(x @ weight - x @ deq)) or 1e-12
    extra = float(np.linalg.norm(outputs[4] - outputs[0])) / weight_error
    row = x[:1]
    times: dict[int, list[float]] = {level: [] for level in LEVELS}
    for _ in range(_ROUNDS):  # interleaved: drift on a shared machine hits both levels
        for level in LEVELS:
            times[level].append(_time(sessions[level], row))
    ms = {level: float(np.median(times[level])) for level in LEVELS}
    chosen = 4 if ms[4] < 0.95 * ms[0] and extra <= 0.5 else 0
    result = {"chosen": chosen, "ms": ms, "extra_error": extra, "shape": [k, n]}
    log.info(
        "MatMulNBits %dx%d %d-bit: accuracy_level 0 %.3f ms, 4 %.3f ms, extra error %.2f -> %d",
        k,
        n,
        quantized.bits,
        ms[0],
        ms[4],
        extra,
        chosen,
    )
    _CACHE[key] = result
    return result
